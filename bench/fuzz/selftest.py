"""Commands that misbehave on purpose, to check that the harness sees each way a case can end
(tests/test_fuzz_inputs.py): main(["segfault"]) dies of SIGSEGV, ["hang"] sleeps, ["raise"]
raises, ["usage"] ends in the one-line error, ["exit3"] exits 3, ["write", PATH] changes a file."""
import os
import signal
import sys
import time

PROG = "python -m sample_fc.tools.selftest"


def main(argv):
    what = argv[0]
    if what == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "hang":
        time.sleep(3600)
    if what == "raise":
        raise ValueError("an unforeseen error")
    if what == "usage":
        print(f"{PROG}: error: a mistake named", file=sys.stderr)
        raise SystemExit(2)
    if what == "exit3":
        raise SystemExit(3)
    if what == "write":
        with open(argv[1], "ab") as handle:
            handle.write(b"!")
    return 0
