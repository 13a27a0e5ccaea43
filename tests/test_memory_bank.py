"""Tests for sample_fc.memory_bank: rows by index, persistence with metadata, split-free init."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc.memory_bank import MemoryBank, fill_initial_centers, read_shard


def test_get_set_touch_only_the_given_rows():
    """Test that set() writes exactly the indexed rows of weight and momentum."""
    bank = MemoryBank(50, 4, mx.cpu(), seed=1)
    before = bank.weight.asnumpy()
    index = np.array([3, 17, 49])
    weight, momentum = bank.get(index)
    np.testing.assert_array_equal(weight.asnumpy(), before[index])
    bank.set(index, weight + 1.0, momentum - 2.0)
    after, mom = bank.weight.asnumpy(), bank.momentum.asnumpy()
    np.testing.assert_array_equal(after[index], before[index] + 1.0)
    np.testing.assert_array_equal(mom[index], -2.0)
    others = np.setdiff1d(np.arange(50), index)
    np.testing.assert_array_equal(after[others], before[others])
    assert not mom[others].any()


def test_initial_centers_do_not_depend_on_the_split():
    """Test that rank shards of 2 or 3 workers hold the same initial rows as 1 worker."""
    classes = 10_000                       # spans several init blocks of 4096
    whole = MemoryBank.for_rank(classes, 0, 1, 8, mx.cpu(), seed=3).weight.asnumpy()
    for world in (2, 3):
        parts = [MemoryBank.for_rank(classes, r, world, 8, mx.cpu(), seed=3).weight.asnumpy()
                 for r in range(world)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
    assert abs(whole.std() - 0.01) < 5e-4
    assert not np.array_equal(whole, fill_initial_centers(np.empty((classes, 8), np.float32), 0, 4))


def test_save_load_round_trip_and_metadata(tmp_path):
    """Test that save/load restores weight and momentum and records the shard's metadata."""
    bank = MemoryBank.for_rank(101, 1, 2, 6, mx.cpu(), seed=0)
    bank.set(np.array([0, 7]), mx.nd.ones((2, 6)), mx.nd.full((2, 6), 3.0))
    path = str(tmp_path / "bank.params")
    bank.save(path)
    meta, _, _ = read_shard(path)
    assert meta == {"version": 1, "num_classes": 101, "world_size": 2, "rank": 1,
                    "class_start": 51, "num_local": 50, "embedding_size": 6}
    other = MemoryBank.for_rank(101, 1, 2, 6, mx.cpu(), seed=9)
    other.load(path)
    np.testing.assert_array_equal(other.weight.asnumpy(), bank.weight.asnumpy())
    np.testing.assert_array_equal(other.momentum.asnumpy(), bank.momentum.asnumpy())


@pytest.mark.parametrize("change, message", [
    (dict(num_classes=102), "num_classes=101"),
    (dict(embedding_size=8), "embedding_size=6"),
    (dict(world_size=3), "class_start=51"),
])
def test_load_mismatch_is_a_clear_error(tmp_path, change, message):
    """Test that loading a shard saved for another setup names the mismatching field."""
    spec = dict(num_classes=101, rank=1, world_size=2, embedding_size=6)
    MemoryBank.for_rank(ctx=mx.cpu(), **spec).save(str(tmp_path / "bank.params"))
    spec.update(change)
    with pytest.raises(ValueError, match=message):
        MemoryBank.for_rank(ctx=mx.cpu(), **spec).load(str(tmp_path / "bank.params"))


def test_unreadable_file_is_a_clear_error(tmp_path):
    """Test that a file that is not a bank shard is refused with its path in the message."""
    path = tmp_path / "junk.params"
    path.write_bytes(b"not an ndarray file")
    with pytest.raises(ValueError, match="junk.params"):
        read_shard(str(path))
