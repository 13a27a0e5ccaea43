"""Tests for banks whose class centers are 8-bit rows (bank_dtype=int8): their arrays and bytes, the
initial centers encoded from the float32 bank's, a host-kernel step against the same step on a
float32 bank followed by the codec's own encoding (momentum_codec.encode, the hand-checked
definition), shards saved and re-split bit for bit, and the refusals (device kernel, GPU bank,
non-finite centers)."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc.checkpoint import bank_shard_files
from sample_fc.checkpoint.bank_shard import read_shard_arrays, restore_resharded, write_shard
from sample_fc.errors import UsageError
from sample_fc.pfc import head as host_head, memory_bank, momentum_codec
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer
from sample_fc.pfc.head import HostHead
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.memory_bank import MemoryBank, host_view
from sample_fc.pfc.partial_fc import uses_host_kernel
from sample_fc.pfc.rounding import noise, rounding_key
from sample_fc.pfc.row_storage import INITIAL_UPDATE, WEIGHT_STREAM, Storage
from sample_fc.pfc.sampler import Sample


def _identity(array, name):
    return array


@pytest.mark.parametrize("momentum, per_class", [("same", 1088), ("int8", 1088), ("none", 544)])
def test_int8_centers_cost_d_plus_a_scale_per_64_columns(momentum, per_class):
    """Test the bytes of a class at D 512: D codes + 8 float32 scales for the centers, the same
    again for a momentum stored alike (bank_momentum same means the 8-bit rows: one value), none
    without; and the arrays a shard holds."""
    storage = Storage("int8", momentum)
    assert storage.row_bytes(512) == per_class == 512 + 4 * 8 + (0 if momentum == "none" else 512 + 4 * 8)
    assert (storage == Storage("int8", "int8")) == (momentum != "none")
    assert set(storage.arrays(512)) == ({"weight", "weight_scale"} |
                                        (set() if momentum == "none" else {"momentum", "momentum_scale"}))
    assert not storage.device_readable and storage.rounds


@pytest.mark.parametrize("blocks", [1, 3])
def test_initial_int8_centers_are_the_float32_centers_encoded(monkeypatch, blocks):
    """Test that an int8 bank starts from the float32 bank's initial centers encoded with update 0's
    weight noise (in one row block or several), each within one block scale of them, momentum 0."""
    width, num_local, class_start = 70, 23, 101
    if blocks > 1:
        monkeypatch.setattr(memory_bank, "MAX_BLOCK_ELEMENTS", 9 * width)
    bank = MemoryBank(num_local, width, mx.cpu(), class_start=class_start, num_classes=200, seed=7,
                      storage=Storage("int8", "none"))
    assert len(bank.weights) == blocks
    float32 = MemoryBank(num_local, width, mx.cpu(), class_start=class_start, num_classes=200, seed=7)
    centers = float32.to_numpy()[0]
    classes = np.arange(num_local) + class_start
    codes, scales = momentum_codec.encode(centers, noise(rounding_key(7, INITIAL_UPDATE, WEIGHT_STREAM), classes,
                                                         width, bits=momentum_codec.NOISE_BITS))
    weight, momentum = bank.to_numpy()
    np.testing.assert_array_equal(weight, momentum_codec.decode(codes, scales))
    bound = np.repeat(momentum_codec.block_scales(centers), 64, axis=1)[:, :width]
    assert np.all(np.abs(weight - centers) <= bound) and not momentum.any()


@pytest.mark.parametrize("momentum", ["none", "int8"])
def test_a_host_step_on_int8_centers_is_the_float32_step_encoded(monkeypatch, momentum):
    """Test that a host-kernel step (two threads, blocks of 3 rows) on an int8 bank gives the loss
    and embedding gradient of the same step on a float32 bank holding the decoded centers and
    momentum, and stores the float32 bank's new centers encoded with the update's weight noise,
    code for code; rows not sampled keep theirs."""
    monkeypatch.setattr(host_head, "BLOCK_ROWS", 3)
    rng = np.random.default_rng(2)
    num_local, width, num_update = 20, 70, 3
    index, target = np.array([1, 2, 6, 7, 9, 13, 14, 19]), np.array([0, 7, 3, -1, 3, 5])
    embeddings = mx.nd.array(rng.standard_normal((6, width)).astype(np.float32))
    quantised = MemoryBank(num_local, width, mx.cpu(), seed=3, storage=Storage("int8", momentum))
    exact = MemoryBank(num_local, width, mx.cpu(), seed=3, storage=Storage("float32", momentum))
    host_view(exact.weights[0])[:] = quantised.to_numpy()[0]
    before = {name: host_view(blocks[0]).copy() for name, blocks in quantised.row_arrays().items()}
    results = []
    for bank in (exact, quantised):
        head = HostHead(bank, MemoryBankSGDOptimizer(lambda step: 0.3, momentum=0.9, wd=0.01),
                        allreduce_max=_identity, allreduce_sum=_identity, threads=2)
        loss, grad = head.forward_backward(embeddings, Sample(index, target), 6, CombinedMargin(1.0, 0.5, 0.0, 16.0))
        head.update(num_update)
        results.append((loss.asnumpy(), grad.asnumpy()))
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_array_equal(results[1][1], results[0][1])
    want = exact.to_numpy()[0][index]
    codes, scales = momentum_codec.encode(want, noise(rounding_key(3, num_update, WEIGHT_STREAM), index, width,
                                                      bits=momentum_codec.NOISE_BITS))
    np.testing.assert_array_equal(host_view(quantised.weights[0])[index], codes)
    np.testing.assert_array_equal(host_view(quantised.weight_scales[0])[index], scales)
    untouched = np.setdiff1d(np.arange(num_local), index)
    for name, values in before.items():
        np.testing.assert_array_equal(host_view(quantised.row_arrays()[name][0])[untouched], values[untouched])
    assert not np.array_equal(host_view(quantised.weights[0])[index], before["weight"][index])


def test_int8_shards_restore_bit_for_bit_into_another_split(monkeypatch, tmp_path):
    """Test that int8-center shards of 2 ranks (several row blocks) are saved with their codes and
    scales and re-split into 3 ranks with every class's rows bit for bit."""
    monkeypatch.setattr(memory_bank, "MAX_BLOCK_ELEMENTS", 7 * 70 + 3)
    saved, files = [], []
    for rank in range(2):
        bank = MemoryBank.for_rank(100, rank, 2, 70, mx.cpu(), seed=4, storage=Storage("int8", "none"))
        files.append(bank_shard_files(str(tmp_path), rank))
        write_shard(bank, files[-1])
        saved.append(bank)
    meta, arrays = read_shard_arrays(files[0])
    assert (meta["dtype"], meta["momentum_storage"]) == ("int8", "none")
    assert set(arrays) == {"weight", "weight_scale"} and arrays["weight"].dtype == np.int8

    def stored(banks):
        return {name: np.concatenate([b.asnumpy() for bank in banks for b in bank.row_arrays()[name]])
                for name in banks[0].row_arrays()}
    banks = [MemoryBank.for_rank(100, r, 3, 70, mx.cpu(), seed=0, storage=Storage("int8", "none")) for r in range(3)]
    for bank in banks:
        restore_resharded(bank, files)
    for name, values in stored(banks).items():
        np.testing.assert_array_equal(values, stored(saved)[name], err_msg=name)
    with pytest.raises(UsageError, match="has dtype=int8, this bank expects dtype=float32"):
        restore_resharded(MemoryBank.for_rank(100, 0, 1, 70, mx.cpu(), storage=Storage("float32", "none")), files)


def test_int8_centers_are_the_host_kernels_and_refuse_non_finite_rows():
    """Test that the device kernel and a bank off the host are refused in one line naming
    bank_dtype=int8, and that a non-finite center is refused naming its class, nothing written."""
    with pytest.raises(UsageError, match="bank_dtype=int8 runs on the host kernel only"):
        uses_host_kernel("device", "cpu", Storage("int8", "none"))
    with pytest.raises(UsageError, match="bank_dtype=int8 needs the bank in host memory"):
        uses_host_kernel("auto", "gpu", Storage("int8", "none"))
    assert uses_host_kernel("auto", "cpu", Storage("int8", "none"))
    with pytest.raises(ValueError, match="bank_dtype=int8 lives in host memory"):
        MemoryBank(4, 8, mx.gpu(0), storage=Storage("int8", "none"))
    bank = MemoryBank(4, 8, mx.cpu(), storage=Storage("int8", "none"))
    before = host_view(bank.weights[0]).copy()
    values = np.ones((2, 8), dtype=np.float32)
    values[1, 3] = np.nan
    with pytest.raises(ValueError, match="the center of class 3 is not finite"):
        bank.host_rows().put_weights(np.array([1, 3]), values, 5)
    np.testing.assert_array_equal(host_view(bank.weights[0]), before)
    with pytest.raises(ValueError, match="stored as bank_dtype=int8: only the host kernel"):
        bank.device_rows()
