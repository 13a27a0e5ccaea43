"""Test the CPU layout ./horovodrun.sh picks without -np (sample_fc.run.layout): the measured
case nearest in cost, the global batch kept, the default where nothing was measured."""
import json
import math
import os
import subprocess
import sys

import pytest

from conftest import REPO
from sample_fc.run.layout import DEFAULT_WORKERS, MEASURED, Measured, choose, nearest
from sample_fc.symbols import NETWORKS

# a made-up table: three networks of cost 1, 10 and 100 (units of multiply-adds) on 4 cores
COSTS = {("small", 8): 1.0, ("middle", 8): 10.0, ("big", 8): 100.0}
TABLE = (Measured("small", 8, 4, {1: 10.0, 2: 30.0}, "test"),
         Measured("middle", 8, 4, {1: 12.0, 2: 11.0}, "test"),
         Measured("big", 8, 4, {1: 3.0, 2: 2.0}, "test"))


def cost_of(network, image_size):
    return COSTS[network, image_size]


@pytest.mark.parametrize("cost, expected", [(1.0, "small"), (3.0, "small"), (3.3, "middle"), (31.0, "middle"),
                                            (32.0, "big"), (1e6, "big"), (1e-3, "small")])
def test_nearest_is_nearest_on_a_log_scale(cost, expected):
    """Test that the measured case chosen is the nearest in log(multiply-adds): 3.0 is nearer
    1 than 10 (ratios 3 and 3.33) but 3.3 is nearer 10 (3.3 against 3.03), which a linear
    distance (2.3 against 6.7) would get wrong; the boundaries sit at the geometric means."""
    by_log = min(COSTS, key=lambda key: abs(math.log(COSTS[key] / cost)))[0]
    assert by_log == expected                       # the hand-worked expectation, independently
    assert nearest(cost, 4, cost_of, TABLE).network == expected


def test_a_case_measured_fastest_as_one_worker_keeps_the_global_batch():
    """Test that a run nearest to a case measured faster on 1 worker gets 1 worker with the
    default layout's global batch (2 x 48 = 96), and the line names the case and its numbers."""
    layout = choose("mine", 8, 48, 9.0, 4, cost_of, TABLE)
    assert (layout.workers, layout.batch_size) == (1, DEFAULT_WORKERS * 48)
    assert "1 worker x 4 threads" in layout.line and "batch_size 96" in layout.line
    assert "middle at 8 px" in layout.line and "12 samples/s against 11" in layout.line


def test_a_case_measured_fastest_as_two_workers_changes_nothing():
    layout = choose("small", 8, 48, 1.0, 4, cost_of, TABLE)
    assert (layout.workers, layout.batch_size) == (2, 48)
    assert "2 workers x 2 threads: measured fastest on 4 cores for small at 8 px:" in layout.line
    assert "nearest in cost" not in layout.line          # the run is the measured case itself


def test_a_core_count_never_measured_keeps_the_default_and_says_how_to_measure():
    layout = choose("r50", 112, 64, 6.3e9, 16, cost_of, TABLE)
    assert (layout.workers, layout.batch_size) == (DEFAULT_WORKERS, 64)
    assert "no layout was measured on 16 cores" in layout.line
    assert "step_breakdown --networks r50 --sizes 112 --worlds 1,2" in layout.line


def test_the_measured_table_is_of_real_networks_each_as_one_and_two_workers():
    for case in MEASURED:
        assert case.network in NETWORKS and sorted(case.samples_per_s) == [1, 2], case
        assert case.workers == max(case.samples_per_s, key=case.samples_per_s.get)


def train_py(*arguments):
    return subprocess.run([sys.executable, str(REPO / "train.py"), *arguments], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_train_py_prints_the_layout_of_the_run_it_resolves():
    """Test `train.py --print-layout` on train.py's own arguments: r50 at 112 px (measured
    fastest as 1 worker on 2 cores) gets 1 worker of twice the preset's batch_size on this
    2-core machine; a wrong key is train.py's one line, exit 2, nothing on stdout."""
    result = train_py("--network", "r50", "--set", "image_size=112", "--print-layout")
    assert result.returncode == 0, result.stderr
    chosen = json.loads(result.stdout)
    batch = json.loads(train_py("--network", "r50", "--print-config").stdout)["batch_size"]
    if os.cpu_count() == 2:
        assert chosen["np"] == 1 and chosen["train_args"] == ["--set", f"batch_size={2 * batch}"], chosen
        assert "r50 at 112 px" in chosen["line"]
    else:
        assert chosen["np"] == DEFAULT_WORKERS and chosen["train_args"] == [], chosen
    wrong = train_py("--set", "bogus_key=1", "--print-layout")
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr
    assert "train.py: error: unknown config key 'bogus_key'" in wrong.stderr and "Traceback" not in wrong.stderr
