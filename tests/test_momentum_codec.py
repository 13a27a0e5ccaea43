"""Tests for sample_fc.pfc.momentum_codec and int8 / no-momentum banks: the codec (C kernel and NumPy
fallback) against a definition written out here by hand, bit for bit; its rounding unbiased and
its error within a scale; the bank's arrays and bytes; a host-kernel step against a float32
momentum; shards saved and restored (same split and re-split) bit for bit."""
import json
import math

import mxnet as mx
import numpy as np
import pytest

import reference as ref
from sample_fc.pfc.row_storage import Storage
from sample_fc.pfc import head as host_head, memory_bank, momentum_codec, row_storage
from sample_fc.checkpoint.bank_shard import read_shard_arrays, restore_resharded, restore_shard, write_shard
from sample_fc.checkpoint import bank_shard_files
from sample_fc.checkpoint.layout import checkpoint_bytes
from sample_fc.errors import UsageError
from sample_fc.pfc.head import HostHead
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.memory_bank import MemoryBank, host_view
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer
from sample_fc.pfc.partial_fc import PartialFC
from sample_fc.pfc.rounding import noise, rounding_key
from sample_fc.pfc.sampler import Sample

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MARGINS = (1.0, 0.5, 0.0, 16.0)


def _identity(array, name):
    return array


# ---- the definition, by hand: Python integers for the noise, float32 scalars for the math ---
def _mix(z):
    """splitmix64's finalizer on a Python integer."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def noise16_by_hand(key, class_id, column):
    """The 16 noise bits of (class, column): lane column % 4 of the word of the column's group of four."""
    row = _mix(key ^ ((class_id * GOLDEN) & MASK64))
    word = _mix((row + (column // 4) * GOLDEN) & MASK64)
    return (word >> (16 * (column % 4))) & 0xFFFF


def encode_by_hand(values, classes, key):
    """(codes, scales) of float32 rows, one entry at a time: per block of 64 columns scale =
    max|m| / 127, code = clamp(floor(m / scale + noise / 65536), -127, 127), codes 0 where scale is 0."""
    rows, width = values.shape
    codes = np.zeros((rows, width), np.int8)
    scales = np.zeros((rows, (width + 63) // 64), np.float32)
    for i in range(rows):
        for block, start in enumerate(range(0, width, 64)):
            part = values[i, start:start + 64]
            scale = np.float32(max(abs(float(m)) for m in part)) / np.float32(127)
            scales[i, block] = scale
            if scale == 0:
                continue
            for c in range(start, min(start + 64, width)):
                u = np.float32(noise16_by_hand(key, int(classes[i]), c) / 65536)
                x = np.float32(values[i, c]) / scale + u
                assert x.dtype == np.float32
                codes[i, c] = min(127, max(-127, math.floor(x)))
    return codes, scales


def decode_by_hand(codes, scales):
    out = np.zeros(codes.shape, np.float32)
    for i, j in np.ndindex(*codes.shape):
        out[i, j] = np.float32(codes[i, j]) * scales[i, j // 64]
    return out


def _momentum_rows(rng, rows, width):
    """Rows of mixed magnitudes with the cases that matter: an all-zero row, a zero first block,
    a block whose max underflows scale to 0, subnormal and huge values."""
    values = (rng.standard_normal((rows, width)) *
              rng.choice([1e-30, 1e-3, 0.05, 3.0, 1e30], (rows, 1))).astype(np.float32)
    values[0] = 0.0
    values[1, :64] = 0.0
    values[2, :64] = np.float32(1e-45) * rng.choice([-1, 0, 1], min(64, width))   # max / 127 -> 0
    values[3, :5] = [3e-39, -1e-40, 2e-38, 0.0, -0.0][:min(5, width)]
    values[4, :3] = [3e38, -3e38, 1.0][:min(3, width)]
    return values


@pytest.fixture(params=["c", "numpy"])
def kernel(request, monkeypatch):
    """The codec's C kernel (it must be built) or its NumPy fallback."""
    if request.param == "c":
        assert momentum_codec._kernel is not None, "sample_fc.pfc._half_rows (int8) not built: run pip install -e ."
    else:
        monkeypatch.setattr(momentum_codec, "_kernel", None)
    return request.param


# ---- the codec -----------------------------------------------------------------------------
def test_16_bit_noise_is_the_lanes_by_hand_and_13_bits_are_their_low_bits():
    """Test that rounding.noise with bits=16 gives every lane of the splitmix words (written out
    here), and that the float16 rounding's 13 bits are still those lanes' low 13 bits."""
    key, classes = rounding_key(7, 3, 1), [0, 5, 2 ** 40 + 3]
    wide = noise(key, classes, 37, bits=16)
    assert wide.dtype == np.uint32 and wide.shape == (3, 37)
    assert wide.tolist() == [[noise16_by_hand(key, k, c) for c in range(37)] for k in classes]
    np.testing.assert_array_equal(noise(key, classes, 37), wide & 0x1FFF)
    with pytest.raises(ValueError, match="1 to 16 bits"):
        noise(key, classes, 4, bits=17)


@pytest.mark.parametrize("width", [3, 37, 64, 100, 130])
def test_codec_matches_the_definition_by_hand(kernel, width):
    """Test that put_rows writes the codes and scales of the definition by hand (zero rows and
    blocks, a scale that underflows, subnormal and huge values, a short last block), bit for
    bit, into the given rows only; that take_rows decodes them as float32(code) * scale; and
    that encode/decode, the NumPy definitions, agree."""
    rng = np.random.default_rng(width)
    values = _momentum_rows(rng, 12, width)
    classes = rng.integers(0, 10 ** 10, 12)
    key = rounding_key(5, 17, 1)
    want_codes, want_scales = encode_by_hand(values, classes, key)
    codes = rng.integers(-127, 128, (30, width)).astype(np.int8)
    scales = rng.random((30, momentum_codec.scale_columns(width))).astype(np.float32)
    before = codes.copy(), scales.copy()
    rows = np.sort(rng.choice(30, 12, replace=False))
    momentum_codec.put_rows(codes, scales, rows, values, classes, key)
    np.testing.assert_array_equal(codes[rows], want_codes)
    np.testing.assert_array_equal(scales[rows].view(np.uint32), want_scales.view(np.uint32))
    others = np.setdiff1d(np.arange(30), rows)
    np.testing.assert_array_equal(codes[others], before[0][others])
    np.testing.assert_array_equal(scales[others], before[1][others])
    taken = np.full((12, width), np.nan, np.float32)
    momentum_codec.take_rows(codes, scales, rows, taken)
    np.testing.assert_array_equal(taken.view(np.uint32), decode_by_hand(want_codes, want_scales).view(np.uint32))
    codes_np, scales_np = momentum_codec.encode(values, noise(key, classes, width, bits=16))
    np.testing.assert_array_equal(codes_np, want_codes)
    np.testing.assert_array_equal(momentum_codec.decode(codes_np, scales_np).view(np.uint32), taken.view(np.uint32))
    assert not want_codes[0].any() and not want_scales[0].any()              # zero row: scale 0, codes 0
    assert want_scales[2, 0] == 0 and not want_codes[2, :64].any()          # the underflowing scale


@pytest.mark.parametrize("width", [5, 64, 100])
def test_decoded_momentum_is_within_one_scale_of_the_value(width):
    """Test that every decoded entry is within its block's scale (max |m| / 127) of the value,
    and that a row of at most 64 columns has one scale, its max / 127."""
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((200, width)) * rng.choice([1e-6, 1e-2, 10.0], (200, 1))).astype(np.float32)
    codes, scales = momentum_codec.encode(values, noise(rounding_key(0, 1, 1), np.arange(200), width, bits=16))
    assert scales.shape == (200, momentum_codec.scale_columns(width)) == (200, -(-width // 64))
    per_column = np.repeat(scales, 64, axis=1)[:, :width].astype(np.float64)
    error = np.abs(momentum_codec.decode(codes, scales).astype(np.float64) - values)
    assert np.all(error <= per_column * (1 + 2 ** -20))
    assert np.abs(codes).max() == 127 and codes.min() >= -127
    if width <= 64:
        assert scales.shape[1] == 1
        np.testing.assert_array_equal(scales[:, 0], np.abs(values).max(axis=1) / np.float32(127))


def test_stochastic_rounding_is_unbiased_over_updates():
    """Test that the mean of a row's decoded momentum over 2000 updates (each its own key) is the
    row within 4 standard errors at every entry, where rounding to nearest would miss by up to
    half a scale."""
    rng = np.random.default_rng(8)
    row = (rng.standard_normal(64) * 0.01).astype(np.float32)
    codes, scales = np.zeros((1, 64), np.int8), np.zeros((1, 1), np.float32)
    decoded = np.empty((2000, 64), np.float32)
    for update in range(2000):
        momentum_codec.put_rows(codes, scales, [0], row[None], [11], rounding_key(1, update + 1, 1))
        momentum_codec.take_rows(codes, scales, [0], decoded[update:update + 1])
    scale = float(scales[0, 0])
    assert scale == np.float32(np.abs(row).max()) / np.float32(127)
    mean, spread = decoded.astype(np.float64).mean(axis=0), decoded.astype(np.float64).std(axis=0)
    standard_error = np.maximum(spread, 1e-3 * scale) / np.sqrt(len(decoded))
    assert np.all(np.abs(mean - row) <= 4 * standard_error + scale * 2 ** -16)
    nearest = np.round(row / np.float32(scale)) * scale
    assert np.abs(nearest - row).max() > 0.3 * scale                       # the bias avoided


def test_non_finite_momentum_is_refused_naming_the_class_with_nothing_written(kernel):
    """Test that a NaN or inf anywhere in the rows being written is a ValueError naming its class,
    and that no row of the call is written (not even those before it); a row outside the
    block is an IndexError."""
    rng = np.random.default_rng(2)
    for bad in (np.nan, np.inf, -np.inf):
        values = rng.standard_normal((4, 70)).astype(np.float32)
        values[2, 66] = bad
        codes, scales = np.zeros((6, 70), np.int8), np.zeros((6, 2), np.float32)
        with pytest.raises(ValueError, match="the momentum of class 12 is not finite"):
            momentum_codec.put_rows(codes, scales, [0, 1, 3, 5], values, [10, 11, 12, 13], 99)
        assert not codes.any() and not scales.any()
    with pytest.raises(IndexError, match="row 6 of a block of 6 rows"):
        momentum_codec.put_rows(codes, scales, [1, 6], np.ones((2, 70), np.float32), [1, 6], 0)
    assert not codes.any()


# ---- the bank ------------------------------------------------------------------------------
@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 7 rows of 8 numbers (the real limit is 2^31 - 1 numbers)."""
    monkeypatch.setattr(memory_bank, "MAX_BLOCK_ELEMENTS", 7 * 8 + 3)


def test_an_int8_bank_holds_codes_and_scales_in_row_blocks(small_blocks):
    """Test that an int8-momentum bank keeps int8 codes (rows x D) and float32 scales (rows x
    ceil(D / 64)) in the weights' row blocks, every block within MAX_BLOCK_ELEMENTS; starts at
    momentum 0; says its storage; decodes its momentum in to_numpy; and leaves the device path
    and the one-array accessor to banks whose momentum is stored as the weights."""
    bank = MemoryBank.for_rank(101, 1, 2, 8, mx.cpu(), seed=5, storage=Storage(momentum="int8"))
    assert [len(w) for w in bank.weights] == [len(c) for c in bank.momenta] == [len(s) for s in bank.momentum_scales]
    assert all(c.dtype == np.int8 and c.shape[1] == 8 for c in bank.momenta)
    assert all(s.dtype == np.float32 and s.shape[1] == 1 for s in bank.momentum_scales)
    assert all(a.size <= memory_bank.MAX_BLOCK_ELEMENTS for blocks in bank.row_arrays().values() for a in blocks)
    weight, momentum = bank.to_numpy()
    assert momentum.dtype == np.float32 and momentum.shape == weight.shape and not momentum.any()
    np.testing.assert_array_equal(weight, MemoryBank.for_rank(101, 1, 2, 8, mx.cpu(), seed=5).to_numpy()[0])
    assert bank.metadata()["momentum_storage"] == "int8"
    rng = np.random.default_rng(0)
    values = rng.standard_normal((8, 8)).astype(np.float32)
    momentum_codec.put_rows(host_view(bank.momenta[2]), host_view(bank.momentum_scales[2]), np.arange(7),
                            values[:7], np.arange(7) + 65, 3)
    codes, scales = momentum_codec.encode(values[:7], noise(3, np.arange(7) + 65, 8, bits=16))
    np.testing.assert_array_equal(bank.to_numpy()[1][14:21], momentum_codec.decode(codes, scales))
    for call in (lambda: bank.get(np.array([1])), lambda: bank.set(np.array([1]), None, None),
                 lambda: bank.momentum):
        with pytest.raises(ValueError, match="stored as bank_momentum=int8: only the host kernel"):
            call()


def test_a_bank_without_momentum_has_no_momentum_arrays():
    """Test that a bank with momentum_storage none allocates no momentum, gives zeros of the
    weights' shape (float32) as its momentum, and that an unknown storage is refused."""
    bank = MemoryBank(30, 6, mx.cpu(), seed=1, storage=Storage("float16", "none"))
    assert bank.momenta == [] and bank.momentum_scales == [] and list(bank.row_arrays()) == ["weight"]
    weight, momentum = bank.to_numpy()
    assert weight.dtype == np.float16 and momentum.dtype == np.float32 and momentum.shape == (30, 6)
    assert not momentum.any()
    with pytest.raises(ValueError, match="momentum storage must be one of"):
        MemoryBank(3, 2, mx.cpu(), storage=Storage(momentum="int4"))


@pytest.mark.parametrize("dtype, storage, per_class", [
    ("float32", "same", 4096), ("float32", "int8", 2592), ("float32", "none", 2048),
    ("float16", "same", 2048), ("float16", "int8", 1568), ("float16", "none", 1024)])
def test_bytes_per_identity_at_d_512(dtype, storage, per_class):
    """Test the bank's bytes per class at D 512 against the formula: weights D * itemsize plus
    the momentum (D * itemsize; int8: D + 4 ceil(D / 64); none: 0); the plan and the checkpoint
    count the same (D 100: scales of 2 blocks)."""
    itemsize = np.dtype(dtype).itemsize
    momentum = {"same": 512 * itemsize, "int8": 512 + 4 * 8, "none": 0}[storage]
    assert per_class == 512 * itemsize + momentum
    stored = Storage(dtype, storage)
    assert stored.row_bytes(512) == per_class
    assert MemoryBank.bytes_needed(1000, 512, stored) == 1000 * per_class
    layer = PartialFC.memory_bytes(1000, 64, 512, 0.1, stored, host_kernel=True, threads=1)
    assert layer["bank"] == 1000 * per_class
    assert checkpoint_bytes(10, 3000, 512, stored) == 80 + 3000 * per_class + 2 ** 20
    assert stored.row_bytes(100) == 100 * itemsize + {"same": 100 * itemsize, "int8": 100 + 8, "none": 0}[storage]


# ---- the host kernel -----------------------------------------------------------------------
def _step(bank, index, target, embeddings, optimizer, threads=1, num_update=1):
    head = HostHead(bank, optimizer, allreduce_max=_identity, allreduce_sum=_identity, threads=threads)
    loss, grad_x = head.forward_backward(mx.nd.array(embeddings), Sample(index, target), len(embeddings),
                                         CombinedMargin(*MARGINS))
    head.update(num_update)
    return loss.asnumpy(), grad_x.asnumpy()


@pytest.mark.parametrize("form", ["mxnet", "pytorch"])
def test_a_host_step_with_int8_momentum_matches_float32_momentum_within_a_scale(monkeypatch, form):
    """Test that a host-kernel step on an int8-momentum bank (blocks of rows shared by two threads)
    gives the weights of the same step on a float32-momentum bank holding the same (decoded)
    momentum, bit for bit, and stores the new momentum within one block scale of the float32
    bank's; rows not sampled keep their codes and scales."""
    monkeypatch.setattr(host_head, "BLOCK_ROWS", 3)
    rng = np.random.default_rng(4)
    num_local, width = 20, 70
    quantised = MemoryBank(num_local, width, mx.cpu(), seed=3, storage=Storage(momentum="int8"))
    start = (rng.standard_normal((num_local, width)) * 0.01).astype(np.float32)
    codes, scales = host_view(quantised.momenta[0]), host_view(quantised.momentum_scales[0])
    momentum_codec.put_rows(codes, scales, np.arange(num_local), start, np.arange(num_local), 1)
    codes0, scales0 = codes.copy(), scales.copy()
    exact = MemoryBank(num_local, width, mx.cpu(), seed=3)
    exact.momentum[:] = mx.nd.array(quantised.to_numpy()[1])            # the same momentum, as float32
    index, target = np.array([1, 2, 6, 7, 9, 13, 14, 19]), np.array([0, 7, 3, -1, 3, 5])
    embeddings = rng.standard_normal((6, width)).astype(np.float32)
    for bank in (exact, quantised):
        optimizer = MemoryBankSGDOptimizer(lambda step: 0.3, momentum=0.9, wd=0.01, momentum_form=form)
        _step(bank, index, target, embeddings, optimizer, threads=2, num_update=2)
    (weight, momentum), (q_weight, q_momentum) = exact.to_numpy(), quantised.to_numpy()
    np.testing.assert_array_equal(q_weight, weight)
    new_scales = momentum_codec.block_scales(momentum[index])
    bound = np.repeat(new_scales, 64, axis=1)[:, :width] * (1 + 2 ** -20)
    assert np.all(np.abs(q_momentum[index] - momentum[index]) <= bound)
    assert not np.array_equal(q_momentum[index], momentum[index])
    np.testing.assert_array_equal(host_view(quantised.momentum_scales[0])[index], new_scales)
    untouched = np.setdiff1d(np.arange(num_local), index)
    np.testing.assert_array_equal(codes[untouched], codes0[untouched])
    np.testing.assert_array_equal(scales[untouched], scales0[untouched])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_int8_momentum_rounds_the_same_whatever_the_threads_blocks_or_kernel(small_blocks, monkeypatch, dtype):
    """Test that two host steps on an int8-momentum bank (float32 or float16 weights) give the
    same codes, scales and weights, bit for bit, on one thread or three, in one row block or
    several, with the C kernel or the NumPy one: the noise is a function of (seed, update,
    class, column) only."""
    monkeypatch.setattr(host_head, "BLOCK_ROWS", 3)
    rng = np.random.default_rng(6)
    index, target = np.array([0, 3, 6, 7, 8, 15, 22, 39]), np.array([0, 3, -1, 7, 4])
    embeddings = rng.standard_normal((5, 8)).astype(np.float32)
    results = []
    for threads, limit, kernel in ((1, 2 ** 31 - 1, momentum_codec._kernel), (3, 7 * 8 + 3, momentum_codec._kernel),
                                   (2, 7 * 8 + 3, None)):
        monkeypatch.setattr(memory_bank, "MAX_BLOCK_ELEMENTS", limit)
        monkeypatch.setattr(momentum_codec, "_kernel", kernel)
        bank = MemoryBank(40, 8, mx.cpu(), seed=2, storage=Storage(dtype, "int8"))
        optimizer = MemoryBankSGDOptimizer(lambda step: 0.5, momentum=0.9, wd=0.01, momentum_form="pytorch")
        for step in (1, 2):
            _step(bank, index, target, embeddings, optimizer, threads=threads, num_update=step)
        blocks = bank.row_arrays()
        results.append({name: np.concatenate([b.asnumpy() for b in arrays]) for name, arrays in blocks.items()})
    for other in results[1:]:
        for name, values in results[0].items():
            np.testing.assert_array_equal(other[name], values, err_msg=name)
    assert results[0]["momentum"].any()


@pytest.mark.parametrize("form", ["mxnet", "pytorch"])
def test_a_host_step_without_momentum_is_plain_sgd(monkeypatch, form):
    """Test that a host step on a bank without momentum updates the sampled rows as NumPy's SGD
    without momentum at momentum SGD's built-up step (w - lr / (1 - momentum) (g + wd w), lr in
    either form), and leaves the other rows bit-identical."""
    monkeypatch.setattr(host_head, "BLOCK_ROWS", 3)
    bank = MemoryBank(20, 5, mx.cpu(), seed=3, storage=Storage(momentum="none"))
    weight0 = bank.to_numpy()[0]
    index, target = np.array([1, 2, 6, 7, 9, 13, 14, 19]), np.array([0, 7, 3, -1, 3, 5])
    embeddings = np.random.default_rng(11).standard_normal((6, 5)).astype(np.float32)
    optimizer = MemoryBankSGDOptimizer(lambda step: 0.3 * step, momentum=0.9, wd=0.01, momentum_form=form)
    loss, grad_x = _step(bank, index, target, embeddings, optimizer, threads=2, num_update=2)
    want_loss, want_x, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index], target, *MARGINS)
    ref.assert_close(loss, [want_loss], 1e-5)
    ref.assert_close(grad_x, want_x, 1e-5)
    weight = bank.to_numpy()[0]
    ref.assert_close(weight[index], weight0[index] - 0.6 / (1 - 0.9) * (want_w + 0.01 * weight0[index]), 1e-5)
    untouched = np.setdiff1d(np.arange(20), index)
    np.testing.assert_array_equal(weight[untouched], weight0[untouched])


# ---- shards on disk ------------------------------------------------------------------------
def _int8_shard(rank, world, seed=4, dtype="float32"):
    """The int8-momentum bank of `rank` of `world` (100 classes x 70), every third row's momentum set."""
    bank = MemoryBank.for_rank(100, rank, world, 70, mx.cpu(), seed=seed, storage=Storage(dtype, "int8"))
    rng = np.random.default_rng(rank)
    rows = np.arange(0, bank.num_local, 3)
    values = rng.standard_normal((len(rows), 70)).astype(np.float32) * 0.01
    for block, positions, local in bank.block_slices(rows):
        momentum_codec.put_rows(host_view(bank.momenta[block]), host_view(bank.momentum_scales[block]), local,
                                values[positions], local + bank.class_start + bank.starts[block], 5)
    return bank


def _stored(banks):
    """{name: every row of the banks' arrays, in class order}."""
    return {name: np.concatenate([b.asnumpy() for bank in banks for b in bank.row_arrays()[name]])
            for name in banks[0].row_arrays()}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_int8_shards_restore_bit_for_bit_into_any_split(small_blocks, tmp_path, monkeypatch, dtype):
    """Test that int8-momentum shards of 2 ranks are written with their codes and scales, restore
    into the same split and re-split into 1 and 3 ranks (several row blocks, small chunks) with
    every class's weights, codes and scales bit for bit."""
    import sample_fc.checkpoint.bank_shard as bank_shard
    monkeypatch.setattr(bank_shard, "CHUNK_ROWS", 5)
    monkeypatch.setattr(memory_bank, "MAX_BLOCK_ELEMENTS", 7 * 70 + 3)
    saved, all_files = [_int8_shard(rank, 2, dtype=dtype) for rank in range(2)], []
    for rank, bank in enumerate(saved):
        files = bank_shard_files(str(tmp_path), rank)
        write_shard(bank, files)
        all_files.append(files)
        meta, arrays = read_shard_arrays(files)
        assert meta["momentum_storage"] == "int8" and set(arrays) == {"weight", "momentum", "momentum_scale"}
        assert arrays["momentum"].dtype == np.int8 and arrays["momentum_scale"].shape == (50, 2)
    want = _stored(saved)
    same = MemoryBank.for_rank(100, 1, 2, 70, mx.cpu(), seed=0, storage=Storage(dtype, "int8"))
    restore_shard(same, all_files[1])
    for name, values in _stored([same]).items():
        np.testing.assert_array_equal(values, _stored([saved[1]])[name], err_msg=name)
    for world in (1, 3):
        banks = [MemoryBank.for_rank(100, r, world, 70, mx.cpu(), seed=0, storage=Storage(dtype, "int8"))
                 for r in range(world)]
        for bank in banks:
            restore_resharded(bank, all_files)
        for name, values in _stored(banks).items():
            np.testing.assert_array_equal(values, want[name], err_msg=f"{name}, world {world}")


def test_a_shard_refuses_another_momentum_storage_and_old_shards_read_as_same(tmp_path):
    """Test that restoring a shard into a bank that stores its momentum otherwise is refused in
    one line naming both storages (same split and re-split); that a shard without momentum
    writes no momentum file; and that a shard saved before momentum_storage existed restores
    as one stored as the weights."""
    files = bank_shard_files(str(tmp_path), 0)
    write_shard(_int8_shard(0, 1), files)
    for restore in (lambda bank: restore_shard(bank, files), lambda bank: restore_resharded(bank, [files])):
        with pytest.raises(UsageError, match="has momentum_storage=int8, this bank expects momentum_storage=same"):
            restore(MemoryBank.for_rank(100, 0, 1, 70, mx.cpu()))
    none_files = bank_shard_files(str(tmp_path / "none"), 0)
    (tmp_path / "none").mkdir()
    plain = MemoryBank.for_rank(100, 0, 1, 70, mx.cpu(), seed=3, storage=Storage(momentum="none"))
    write_shard(plain, none_files)
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["bank-rank0.json", "bank-rank0.weight.npy"]
    other = MemoryBank.for_rank(100, 0, 1, 70, mx.cpu(), seed=9, storage=Storage(momentum="none"))
    restore_shard(other, none_files)
    np.testing.assert_array_equal(other.to_numpy()[0], plain.to_numpy()[0])
    with pytest.raises(UsageError, match="has momentum_storage=none, this bank expects momentum_storage=int8"):
        restore_shard(MemoryBank.for_rank(100, 0, 1, 70, mx.cpu(), storage=Storage(momentum="int8")), none_files)
    old_files = bank_shard_files(str(tmp_path / "old"), 0)
    (tmp_path / "old").mkdir()
    old = MemoryBank.for_rank(100, 0, 1, 70, mx.cpu(), seed=2)
    old.momentum[:] = 0.5
    write_shard(old, old_files)
    with open(old_files["meta"]) as handle:
        meta = json.load(handle)
    del meta["momentum_storage"]
    with open(old_files["meta"], "w") as handle:
        json.dump(meta, handle)
    assert read_shard_arrays(old_files)[0]["momentum_storage"] == "same"
    restored = MemoryBank.for_rank(100, 0, 1, 70, mx.cpu(), seed=8)
    restore_shard(restored, old_files)
    np.testing.assert_array_equal(restored.momentum.asnumpy(), old.momentum.asnumpy())
