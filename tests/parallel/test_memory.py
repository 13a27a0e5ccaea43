"""Test that a run whose memory plan cannot fit this machine is refused at start-up, before
anything is allocated or written."""
import re
import sys

from conftest import REPO, per_rank_tail
from bench.harness import run_job


def test_a_bank_too_big_for_the_machine_is_one_line_and_writes_nothing(tmp_path):
    """Test that 20,000,000 classes x 512 on 2 workers (41 GB of bank each) exits 2 within 60 s
    with one line giving the GB needed and available and the ways out, no traceback, and
    nothing written (no models root, no lock beside it)."""
    root = tmp_path / "m"
    argv = [sys.executable, str(REPO / "train.py"), "--dataset", "synthetic_1m", "--models-root", str(root),
            "--set", "num_classes=20000000"]
    result = run_job(argv, num_proc=2, timeout_s=180, cwd=str(REPO))
    assert result.returncode == 2 and result.seconds < 60, (result.seconds, per_rank_tail(result.output))
    lines = [line for line in result.output.splitlines() if "train.py: error:" in line]
    assert len(lines) == 1 and "Traceback" not in result.output, per_rank_tail(result.output)
    assert "GB of host memory per worker (bank 41.0 GB for 10,000,000 classes" in lines[0]
    assert re.search(r"and \d+\.\d GB are available \(\d+\.\d GB shared by 2 worker\(s\) on this node\); "
                     r"ways out: more workers: -np \d+ \(\d+\.\d GB per worker", lines[0]), lines[0]
    assert re.search(r"bank_dtype=float16, half the bank \(\d+\.\d GB per worker", lines[0]), lines[0]
    assert re.search(r"a smaller batch: batch_size=\d+ \(\d+\.\d GB per worker", lines[0]), lines[0]
    assert list(tmp_path.iterdir()) == []


def test_the_plan_is_within_a_quarter_above_the_measured_peak(tmp_path):
    """Test the memory plan against real runs (bench.memory: train.py under horovodrun, 6 steps and
    a checkpoint; each rank's VmHWM at the end): 1 worker on synthetic images, 2 workers with a
    float16 bank and 8-bit momentum for 200,000 classes, and 2 workers on a demo set verifying 200
    held-out pairs after each step; every plan is at least the largest worker's peak and at most 1.25x
    it."""
    from bench import memory
    for case in memory.QUICK:
        record = memory.measure(case, timeout_s=300)
        assert "ratio" in record, record
        assert 1.0 <= record["ratio"] <= 1.25, record
