"""bench.step_breakdown on the smallest case: one sample_fc row whose stages account for its
step, and the yardstick's row beside it (the benchmark itself is not a test)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_case_gives_a_sample_fc_row_and_a_yardstick_row():
    """Test that one case (mbf, 32 px, one worker) gives a sample_fc row, a yardstick row read
    from the demo's .rec by its loader and a tuned row (channels-last, from memory), each with
    samples/s = batch / step, and stages that account for the step."""
    # the tool runs in a process of its own, which imports torch (a test requirement); this process
    # may not even look it up: sample_fc.dist, once imported, bars torch (sys.modules["torch"] = None)
    result = subprocess.run([sys.executable, "-m", "bench.step_breakdown", "--networks", "mbf",
                             "--sizes", "32", "--worlds", "1", "--steps", "2", "--global-batch", "32"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    table = [line for line in result.stdout.splitlines() if line.startswith("| mbf ")]
    rows = {line.split("|")[3].strip(): [cell.strip() for cell in line.split("|")[1:-1]] for line in table[-3:]}
    assert set(rows) == {"sample_fc", "yardstick (rec, 2 loader workers)", "tuned (memory, channels-last)"}
    ours, theirs = rows["sample_fc"], rows["yardstick (rec, 2 loader workers)"]
    for row in (ours, theirs, rows["tuned (memory, channels-last)"]):
        step_ms, samples_per_s = float(row[4]), float(row[5])
        assert step_ms > 0 and samples_per_s == pytest.approx(32 / step_ms * 1e3, rel=0.02)
    assert 0.6 * float(ours[4]) <= sum(float(cell) for cell in ours[6:]) <= 1.8 * float(ours[4])
    # the yardstick's step is the median of its steps' totals: with 2 steps, the stages' sum (rounding aside)
    assert sum(float(cell) for cell in theirs[6:]) == pytest.approx(float(theirs[4]), abs=6)
    assert float(theirs[7]) > 0 and float(theirs[9]) > 0            # forward, backward


@pytest.mark.parametrize("args,words", [(["--networks", "mbf,nosuch"], "unknown nosuch"),
                                        (["--sizes", "30"], "multiples of 16"),
                                        (["--worlds", "3"], "must divide --global-batch 128"),
                                        (["--networks", "mbf_small"], "the yardstick has no mbf_small; "
                                         "arcface_torch's networks it has: mbf, r18")])
def test_a_case_that_cannot_run_is_one_line_before_any_job(args, words):
    """Test that a bad network, size or world (or a network the yardstick lacks) is one line
    from the parser, before any job starts."""
    result = subprocess.run([sys.executable, "-m", "bench.step_breakdown"] + args,
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and words in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
