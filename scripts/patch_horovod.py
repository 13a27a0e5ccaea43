"""Fix known bugs in the Horovod 0.28.1 source tree before scripts/bootstrap.sh builds it.

    python scripts/patch_horovod.py <extracted horovod-0.28.1 directory>

Each fix replaces one exact piece of text that must occur exactly once (or is already
fixed); anything else stops the build with the file and text named, so a different
Horovod source never gets half-patched.

1. Stall shutdown under Gloo. GlooController::Initialize sizes the list of global ranks
   with reserve() instead of resize(), so the list stays empty. The stall inspector walks
   that list to find missing ranks, so under the Gloo controller it never warns and never
   shuts a stalled job down: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (train.py's
   collective_timeout_s) did nothing and a hung rank hung the whole job. MPI is unaffected.
"""
import sys
from pathlib import Path

FIXES = [
    ("horovod/common/gloo/gloo_controller.cc",
     "global_ranks_.reserve(size_);", "global_ranks_.resize(size_);"),
]


def apply_fixes(source_root):
    for relative, old, new in FIXES:
        path = Path(source_root) / relative
        if not path.is_file():
            sys.exit(f"patch_horovod: {path} not found; expected a horovod-0.28.1 source tree")
        text = path.read_text()
        found = text.count(old)
        if found == 0 and text.count(new) == 1:
            print(f"patch_horovod: {relative}: already fixed")
            continue
        if found != 1:
            sys.exit(f"patch_horovod: {relative}: expected {old!r} exactly once, "
                     f"found it {found} times; is this Horovod 0.28.1?")
        path.write_text(text.replace(old, new))
        print(f"patch_horovod: {relative}: {old} -> {new}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    apply_fixes(sys.argv[1])
