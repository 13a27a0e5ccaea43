"""Tests for sample_fc.pfc.memory_bank and bank_shard: rows by index, row blocks (several blocks
behave bit for bit as one), persistence with metadata, split-free init, re-splitting."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc.pfc.row_storage import Storage
from sample_fc.pfc import memory_bank
from sample_fc.checkpoint.bank_shard import read_shard, restore_resharded, restore_shard, write_shard
from sample_fc.checkpoint import bank_shard_files
from sample_fc.errors import UsageError
from sample_fc.pfc.device_head import DeviceHead
from sample_fc.pfc.head import HostHead
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.memory_bank import INIT_BLOCK, MemoryBank, fill_initial_centers
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer
from sample_fc.pfc.sampler import Sample


def _identity(array, name):
    return array


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 rows of 8 numbers (the real limit is 2^31 - 1 numbers)."""
    monkeypatch.setattr(memory_bank, "MAX_BLOCK_ELEMENTS", 7 * 8 + 3)


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


def test_several_blocks_hold_and_move_rows_as_one(small_blocks):
    """Test that a shard of 50 rows in blocks of 7 (the last one short) starts with the one-block
    shard's centers, and that get/set on an index crossing every block read and write the same
    rows, bit for bit; the whole-shard accessors refuse a shard of several blocks."""
    blocked = MemoryBank.for_rank(101, 1, 2, 8, mx.cpu(), seed=5)
    assert [len(w) for w in blocked.weights] == [7] * 7 + [1] and blocked.starts[-1] == 49
    memory_bank.MAX_BLOCK_ELEMENTS = 2 ** 31 - 1
    one = MemoryBank.for_rank(101, 1, 2, 8, mx.cpu(), seed=5)
    np.testing.assert_array_equal(blocked.to_numpy()[0], one.weight.asnumpy())
    index = np.array([0, 6, 7, 13, 14, 30, 48, 49])
    for bank in (blocked, one):
        weight, momentum = bank.get(index)
        bank.set(index, weight * 3.0 + 1.0, momentum - weight)
    for mine, theirs in zip(blocked.to_numpy(), (one.weight.asnumpy(), one.momentum.asnumpy())):
        np.testing.assert_array_equal(mine, theirs)
    with pytest.raises(ValueError, match="8 row blocks"):
        blocked.weight


@pytest.mark.parametrize("kernel", ["host", "device"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_head_step_on_several_blocks_equals_one_block(small_blocks, kernel, dtype):
    """Test that a head step and bank update (either kernel, either bank dtype: a float16 row's
    rounding noise depends on its class, not its block) on a shard of several blocks give the
    same loss, gradient, weights and momentum as on one block, bit for bit, at a sample
    crossing the blocks."""
    results = []
    for limit in (7 * 8 + 3, 2 ** 31 - 1):
        memory_bank.MAX_BLOCK_ELEMENTS = limit
        bank = MemoryBank(40, 8, mx.cpu(), seed=2, storage=Storage(dtype))
        optimizer = MemoryBankSGDOptimizer(lambda step: 0.5, momentum=0.9, wd=0.01, momentum_form="pytorch")
        head = (HostHead if kernel == "host" else DeviceHead)(bank, optimizer, allreduce_max=_identity,
                                                              allreduce_sum=_identity)
        embeddings = mx.nd.array(np.random.default_rng(1).standard_normal((5, 8)))
        index = np.array([1, 6, 7, 8, 20, 27, 33, 39])
        for step in (1, 2):
            loss, grad = head.forward_backward(embeddings, Sample(index, np.array([0, 3, -1, 7, 4])), 5,
                                               CombinedMargin(1.0, 0.5, 0.0, 8.0))
            head.update(step)
        results.append((loss.asnumpy(), grad.asnumpy()) + bank.to_numpy())
    for blocked, one in zip(*results):
        np.testing.assert_array_equal(blocked, one)


def test_save_load_round_trip_and_metadata(tmp_path):
    """Test that a shard written and restored keeps weight and momentum and records its metadata."""
    bank = MemoryBank.for_rank(101, 1, 2, 6, mx.cpu(), seed=0)
    bank.set(np.array([0, 7]), mx.nd.ones((2, 6)), mx.nd.full((2, 6), 3.0))
    files = bank_shard_files(str(tmp_path), 1)
    write_shard(bank, files)
    meta, weight, _ = read_shard(files)
    assert meta == {"version": 2, "num_classes": 101, "world_size": 2, "rank": 1, "class_start": 51,
                    "num_local": 50, "embedding_size": 6, "dtype": "float32", "momentum_storage": "same"}
    assert not isinstance(weight, np.ndarray)             # read when asked for, not loaded whole
    np.testing.assert_array_equal(np.asarray(weight[7:9]), bank.weight.asnumpy()[7:9])
    other = MemoryBank.for_rank(101, 1, 2, 6, mx.cpu(), seed=9)
    restore_shard(other, files)
    np.testing.assert_array_equal(other.weight.asnumpy(), bank.weight.asnumpy())
    np.testing.assert_array_equal(other.momentum.asnumpy(), bank.momentum.asnumpy())


def test_blocks_save_restore_and_resplit_bit_equal(small_blocks, tmp_path, monkeypatch):
    """Test that shards written from several blocks restore into one block and back, and that
    3 saved shards re-split onto 2 ranks (CHUNK_ROWS small: copies cross blocks and chunks) give
    every class its row, bit for bit."""
    import sample_fc.checkpoint.bank_shard as bank_shard
    monkeypatch.setattr(bank_shard, "CHUNK_ROWS", 5)
    saved = []
    for rank in range(3):
        bank = MemoryBank.for_rank(100, rank, 3, 8, mx.cpu(), seed=4)
        bank.set(np.arange(0, bank.num_local, 3), *(a * 2.0 for a in bank.get(np.arange(0, bank.num_local, 3))))
        files = bank_shard_files(str(tmp_path), rank)
        write_shard(bank, files)
        saved.append((files, bank.to_numpy()))
    whole = [np.concatenate([s[1][k] for s in saved]) for k in (0, 1)]
    for limit in (7 * 8 + 3, 2 ** 31 - 1):
        memory_bank.MAX_BLOCK_ELEMENTS = limit
        same = MemoryBank.for_rank(100, 1, 3, 8, mx.cpu(), seed=0)
        restore_shard(same, saved[1][0])
        for mine, want in zip(same.to_numpy(), saved[1][1]):
            np.testing.assert_array_equal(mine, want)
        halves = [MemoryBank.for_rank(100, r, 2, 8, mx.cpu(), seed=0) for r in range(2)]
        for half in halves:
            restore_resharded(half, [files for files, _ in saved])
        for k in (0, 1):
            np.testing.assert_array_equal(np.concatenate([h.to_numpy()[k] for h in halves]), whole[k])


def test_a_float16_shard_keeps_its_dtype(tmp_path):
    """Test that a float16 bank's shard is written and restored as float16 (bit for bit), and
    that restoring it into a float32 bank is refused naming the dtype."""
    bank = MemoryBank.for_rank(40, 0, 1, 6, mx.cpu(), seed=2, storage=Storage("float16"))
    assert bank.weight.dtype == np.float16
    files = bank_shard_files(str(tmp_path), 0)
    write_shard(bank, files)
    assert read_shard(files)[0]["dtype"] == "float16"
    other = MemoryBank.for_rank(40, 0, 1, 6, mx.cpu(), seed=5, storage=Storage("float16"))
    restore_shard(other, files)
    np.testing.assert_array_equal(other.weight.asnumpy(), bank.weight.asnumpy())
    np.testing.assert_array_equal(bank.weight.asnumpy(),
                                  MemoryBank.for_rank(40, 0, 1, 6, mx.cpu(), seed=2).weight.asnumpy().astype(np.float16))
    with pytest.raises(UsageError, match="dtype=float16, this bank expects dtype=float32"):
        restore_shard(MemoryBank.for_rank(40, 0, 1, 6, mx.cpu()), files)


def test_a_shard_saved_in_format_1_still_restores(tmp_path):
    """Test that a bank shard of a run saved before format 2 (one MXNet file) restores."""
    bank = MemoryBank.for_rank(30, 0, 1, 4, mx.cpu(), seed=1)
    files = bank_shard_files(str(tmp_path), 0)
    meta = mx.nd.array([1, 30, 1, 0, 0, 30, 4], dtype="int64")
    mx.nd.save(files["legacy"], {"weight": bank.weight * 2, "momentum": bank.weight - 1, "meta": meta})
    other = MemoryBank.for_rank(30, 0, 1, 4, mx.cpu(), seed=7)
    restore_shard(other, files)
    np.testing.assert_array_equal(other.weight.asnumpy(), (bank.weight * 2).asnumpy())
    np.testing.assert_array_equal(other.momentum.asnumpy(), (bank.weight - 1).asnumpy())


@pytest.mark.parametrize("change, message", [
    (dict(num_classes=102), "num_classes=101"),
    (dict(embedding_size=8), "embedding_size=6"),
    (dict(world_size=3), "class_start=51"),
])
def test_load_mismatch_is_a_clear_error(tmp_path, change, message):
    """Test that restoring a shard saved for another setup names the mismatching field."""
    spec = dict(num_classes=101, rank=1, world_size=2, embedding_size=6)
    files = bank_shard_files(str(tmp_path), 1)
    write_shard(MemoryBank.for_rank(ctx=mx.cpu(), **spec), files)
    spec.update(change)
    with pytest.raises(UsageError, match=message):
        restore_shard(MemoryBank.for_rank(ctx=mx.cpu(), **spec), files)


def test_unreadable_file_is_a_clear_error(tmp_path):
    """Test that files that are not a bank shard are refused with the path in the message."""
    files = bank_shard_files(str(tmp_path), 0)
    open(files["meta"], "w").write("{}")
    for key in ("weight", "momentum"):
        open(files[key], "wb").write(b"not an array file")
    with pytest.raises(UsageError, match="bank-rank0"):
        read_shard(files)
    with pytest.raises(UsageError, match="bank shard .*bank-rank1.json not found"):
        read_shard(bank_shard_files(str(tmp_path), 1))
    write_shard(MemoryBank(20, 4, mx.cpu()), files)
    data = open(files["momentum"], "rb").read()
    open(files["momentum"], "wb").write(data[:-16])                     # a truncated copy
    with pytest.raises(UsageError, match=r"bank-rank0.json.*shorter than its \(20, 4\) rows"):
        read_shard(files)


@pytest.mark.parametrize("weights, momentum", [("float32", "same"), ("float16", "int8"), ("float32", "none")])
def test_storage_is_one_value_read_back_from_what_a_shard_and_a_config_say(weights, momentum):
    """Test that a bank's Storage is what its shard's meta reads back as (and a saved config's
    bank_dtype / bank_momentum), that a meta saved before the momentum had a format reads as
    momentum stored as the weights, and that an unknown word is a ValueError naming it."""
    storage = Storage(weights, momentum)
    bank = MemoryBank(3, 4, mx.cpu(), storage=storage)
    assert Storage.from_meta(bank.metadata()) == storage
    assert Storage.from_meta({"bank_dtype": weights, "bank_momentum": momentum}) == storage
    assert Storage.from_meta({"dtype": weights}) == Storage(weights, "same")
    assert storage.device_readable == (momentum in ("same", "none"))
    for bad in ({"weights": "int4"}, {"momentum": "int4"}):
        with pytest.raises(ValueError, match="int4"):
            Storage(**bad)


def test_the_head_benchs_row_traffic_reads_and_writes_rows_of_every_block(small_blocks):
    """Test that bench.cases.rows_traffic_ms (the head bench's bound) takes and puts back sampled
    rows of a bank held in several row blocks, rows past the first block included (it indexed the
    first block only: an IndexError at 5M classes x 512), and leaves every row as it was."""
    from bench.cases import rows_traffic_ms
    bank = MemoryBank(40, 8, mx.cpu(), seed=3)
    assert len(bank.row_arrays()["weight"]) == 6
    before = bank.to_numpy()
    assert rows_traffic_ms(bank, np.array([39, 2, 8, 21, 35]), repeats=2, block_rows=2) >= 0
    for kept, now in zip(before, bank.to_numpy()):
        np.testing.assert_array_equal(now, kept)


@pytest.mark.parametrize("storage", [Storage("float32", "same"), Storage("int8", "none")])
def test_initial_centers_in_parallel_pieces_equal_one_thread_and_report_every_row(storage):
    """Test that drawing a shard's initial centers 3 threads at a time gives the bank one thread
    gives, bit for bit (float32 and 8-bit centers, a shard starting mid-block), that progress
    hears every row once, in order on the calling thread, and that a bank left for a checkpoint
    (initial_centers False) holds zeros and reports nothing."""
    import threading
    banks, heard = [], []
    for threads in (1, 3):
        rows_seen = []
        main = threading.get_ident()
        banks.append(MemoryBank(3 * INIT_BLOCK + 123, 8, mx.cpu(), class_start=INIT_BLOCK // 2, num_classes=10 ** 6,
                                seed=5, storage=storage, threads=threads,
                                progress=lambda rows: rows_seen.append((rows, threading.get_ident() == main))))
        heard.append(rows_seen)
    for one, three in zip(banks[0].to_numpy(), banks[1].to_numpy()):
        np.testing.assert_array_equal(one, three)
    assert sum(rows for rows, _ in heard[1]) == 3 * INIT_BLOCK + 123 and all(on_main for _, on_main in heard[1])
    silent = []
    empty = MemoryBank(1000, 8, mx.cpu(), storage=storage, initial_centers=False, progress=silent.append)
    assert not np.any(empty.to_numpy()[0]) and silent == []
