"""bench.step_breakdown on the smallest case: one sample_fc row whose stages account for its
step, and the PyTorch reference's row beside it (the benchmark itself is not a test)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_case_gives_a_sample_fc_row_and_a_torch_row():
    # the tool runs in a process of its own, which imports torch (a test requirement); this process
    # may not even look it up: sample_fc.dist, once imported, bars torch (sys.modules["torch"] = None)
    result = subprocess.run([sys.executable, "-m", "sample_fc.bench.step_breakdown", "--networks", "mbf_small",
                             "--sizes", "32", "--worlds", "1", "--steps", "2", "--global-batch", "32"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| mbf_small")]
    rows = {line.split("|")[3].strip(): [cell.strip() for cell in line.split("|")[1:-1]] for line in table[-2:]}
    assert set(rows) == {"sample_fc", "PyTorch"}
    ours = rows["sample_fc"]
    step_ms, samples_per_s = float(ours[4]), float(ours[5])
    assert step_ms > 0 and samples_per_s == pytest.approx(32 / step_ms * 1e3, rel=0.02)
    stages = sum(float(cell) for cell in ours[6:])
    assert 0.6 * step_ms <= stages <= 1.8 * step_ms      # the staged steps time what the plain ones do
    assert float(rows["PyTorch"][5]) > 0


@pytest.mark.parametrize("args,words", [(["--networks", "mbf,nosuch"], "unknown nosuch"),
                                        (["--sizes", "30"], "multiples of 16"),
                                        (["--worlds", "3"], "must divide --global-batch 128")])
def test_a_case_that_cannot_run_is_one_line_before_any_job(args, words):
    result = subprocess.run([sys.executable, "-m", "sample_fc.bench.step_breakdown"] + args,
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and words in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
