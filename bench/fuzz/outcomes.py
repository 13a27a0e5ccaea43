"""A case's outcome from how its command ended, and whether its inputs changed.

    ok              exit 0
    usage           exit 2, stderr's last non-empty line the program's "<prog>: error: " form,
                    no "Traceback" in stderr
    traceback       a traceback in stderr (an exception nobody anticipated)
    signal          killed by a signal (SIGSEGV, SIGBUS, SIGABRT in a C++ loader; the OOM killer)
    hang            past the case's timeout, killed
    changed-input   a file the case was given changed or vanished
    other           any other ending
"""
import hashlib
import os

OUTCOMES = ("ok", "usage", "traceback", "signal", "hang", "changed-input", "other")
FAILURES = ("traceback", "signal", "hang", "changed-input", "other")


def program_prefix(command):
    """The start of the command's one error line."""
    if command.startswith("train"):
        return "train.py: error: "
    return f"python -m sample_fc.tools.{command}: error: "


def last_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def classify(command, finished, changed):
    """The outcome (OUTCOMES) of a lanes.Finished; `changed`: the input files that changed."""
    if finished.fate in ("hang", "signal"):
        return finished.fate
    if "Traceback (most recent call last)" in finished.stderr:
        return "traceback"
    if changed:
        return "changed-input"
    if finished.code == 0:
        return "ok"
    if finished.code == 2 and last_line(finished.stderr).startswith(program_prefix(command)):
        return "usage"
    return "other"


def file_hashes(folder):
    """{relative path: sha256} of every file under `folder`."""
    hashes = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as handle:
                hashes[os.path.relpath(path, folder)] = hashlib.sha256(handle.read()).hexdigest()
    return hashes


def changed_files(before, after, may_change=()):
    """Files of `before` missing or different in `after`, but for those in `may_change` (a
    resumed run's own files in its models root: config.json, train.log, ...)."""
    allowed = set(may_change)
    return sorted(path for path, digest in before.items() if after.get(path) != digest and path not in allowed)
