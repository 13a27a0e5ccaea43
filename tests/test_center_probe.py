"""Test the centers' motion statistics (run/center_probe.py) against hand-computed and NumPy values."""
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import pytest

from sample_fc.pfc.memory_bank import MemoryBank
from sample_fc.pfc.row_storage import Storage
from sample_fc.run.center_probe import PROBE_ROWS, CenterProbe, center_motion, probe_rows


def test_center_motion_by_hand():
    """Test that the mean norm is of the rows after, and the mean turn the angle of each row
    from before to after: a quarter turn and a half turn average 135 degrees; a row scaled
    only does not turn."""
    before = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    after = np.array([[0.0, 3.0], [0.0, -2.0], [6.0, 8.0]])
    found = center_motion(before, after)
    assert found["center_norm"] == pytest.approx((3 + 2 + 10) / 3)
    assert found["center_turn_deg"] == pytest.approx((90 + 180 + 0) / 3)


@pytest.mark.parametrize("rows", [1, 7, PROBE_ROWS, 5000, 123457])
def test_probe_rows_are_evenly_spread(rows):
    """Test that the probe reads every row of a small shard, and at most PROBE_ROWS distinct rows
    spread from the first to the last of a large one."""
    index = probe_rows(rows)
    assert np.all(np.diff(index) > 0) and index[0] == 0 and index[-1] == rows - 1
    assert len(index) == min(rows, PROBE_ROWS) or (rows > PROBE_ROWS and len(index) > 0.99 * PROBE_ROWS)
    if rows > PROBE_ROWS:
        assert np.diff(index).max() - np.diff(index).min() <= 1


@pytest.mark.parametrize("storage", [Storage("float32", "same"), Storage("int8", "none")])
def test_probe_reads_the_rows_a_step_moved(storage):
    """Test that after the step of a progress line the probe holds the motion of its rows between
    the previous step and that one, as NumPy computes it from the whole shard before and after,
    for float32 and 8-bit centers; and that steps between lines hold nothing."""
    bank = MemoryBank(3000, 16, mx.cpu(), seed=3, storage=storage)
    probe = CenterProbe(bank, period=5)
    rng = np.random.default_rng(0)
    for step in range(1, 11):
        if step in (5, 10):
            before = bank.to_numpy()[0][probe.index]
        rows = bank.host_rows()
        index = np.sort(rng.choice(3000, 600, replace=False))
        moved = rows.take_weights(index, np.empty((600, 16), np.float32)) + rng.normal(0, 0.05, (600, 16))
        rows.put_weights(index, moved.astype(np.float32), rows.keys(step)[0])
        probe(SimpleNamespace(step=step))
        if step in (5, 10):
            want = center_motion(before, bank.to_numpy()[0][probe.index])
            assert probe.scalars(step) == pytest.approx(want, rel=1e-6)
            assert want["center_turn_deg"] > 0
        else:
            assert probe.scalars(step) == {}
