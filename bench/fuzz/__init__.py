"""Every file format a user hands us, damaged on purpose, through every command that reads it
(`python -m bench.fuzz`, see __main__.py). The contract checked: a damaged input ends
in one line `<prog>: error: ...` and exit 2, or exit 0 having used only what was sound; never a
traceback, a signal death, a hang, or a changed input file.

    inputs.py    the sound inputs, built once (data, a trained models root, .pth, .onnx, faces, IJB)
    damage.py    seeded damage: byte flips, truncation, empty, appended garbage, swapped files
    cases.py     formats, the commands that read each, the seeded cases
    worker.py    runs tool cases in-process (one MXNet import for many cases)
    lanes.py     the worker lane and the process-per-case lane (signal, hang detection)
    outcomes.py  a case's outcome; input hashes
    harness.py   prepares, runs and classifies the cases
    report.py    the table and the JSON report
"""
from .cases import FORMATS, Case, make_cases  # noqa: F401
from .harness import Harness  # noqa: F401
from .inputs import build_inputs  # noqa: F401
from .outcomes import FAILURES, OUTCOMES, classify  # noqa: F401
