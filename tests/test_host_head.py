"""Tests for sample_fc.pfc.host_head: the CPU kernel against the NumPy reference head and SGD."""
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import reference as ref
from sample_fc.pfc import head as host_head
from sample_fc.pfc.head import HostHead
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.memory_bank import MemoryBank, host_view
from sample_fc.pfc.sampler import Sample

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer  # noqa: E402

MARGINS = (1.0, 0.5, 0.0, 16.0)


def _identity(array, name):
    return array


def _bank(num_local, dim, seed=3):
    bank = MemoryBank(num_local, dim, mx.cpu(), seed=seed)
    rng = np.random.default_rng(seed)
    bank.momentum[:] = mx.nd.array(rng.standard_normal((num_local, dim)) * 0.01)
    return bank


def _host_head(bank, optimizer, threads=1):
    return HostHead(bank, optimizer, allreduce_max=_identity, allreduce_sum=_identity, threads=threads)


@pytest.mark.parametrize("threads, form", [(1, "mxnet"), (2, "mxnet"), (3, "mxnet"), (1, "pytorch"),
                                           (2, "pytorch")])
def test_host_head_step_matches_numpy(monkeypatch, threads, form):
    """Test that loss, d/d embeddings and the SGD-momentum update of the sampled rows equal
    the float64 NumPy head + sgd_mom_update or torch's SGD form (a row whose target is on
    another rank, blocks of rows smaller than the sample shared by 1-3 update threads), and
    that rows not sampled stay bit-identical."""
    monkeypatch.setattr(host_head, "BLOCK_ROWS", 3)            # several update blocks
    rng = np.random.default_rng(11)
    bank = _bank(20, 5)
    weight0, momentum0 = bank.weight.asnumpy(), bank.momentum.asnumpy()
    index = np.array([1, 2, 6, 7, 9, 13, 14, 19])
    target = np.array([0, 7, 3, -1, 3, 5])
    embeddings = rng.standard_normal((6, 5)).astype(np.float32)
    optimizer = MemoryBankSGDOptimizer(lambda step: 0.3 * step, momentum=0.9, wd=0.01, momentum_form=form)
    sgd = ref.sgd_momentum if form == "mxnet" else ref.sgd_momentum_pytorch
    head = _host_head(bank, optimizer, threads=threads)
    loss, grad_x = head.forward_backward(mx.nd.array(embeddings), Sample(index, target), 6, CombinedMargin(*MARGINS))
    head.update(2)

    want_loss, want_x, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index],
                                                    target, *MARGINS)
    want_weight, want_momentum = sgd(weight0[index], want_w, momentum0[index], 0.6, 0.9, 0.01)
    ref.assert_close(loss.asnumpy(), [want_loss], 1e-5)
    ref.assert_close(grad_x.asnumpy(), want_x, 1e-5)
    weight, momentum = bank.weight.asnumpy(), bank.momentum.asnumpy()
    ref.assert_close(weight[index], want_weight, 1e-5)
    ref.assert_close(momentum[index], want_momentum, 1e-5)
    untouched = np.setdiff1d(np.arange(20), index)
    np.testing.assert_array_equal(weight[untouched], weight0[untouched])
    np.testing.assert_array_equal(momentum[untouched], momentum0[untouched])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_both_kernels_step_a_bank_without_momentum_as_numpy_plain_sgd(dtype):
    """Test that a bank stored without momentum (bank_momentum=none, as `auto` picks for many
    classes, on any device) takes, under either kernel, the NumPy head's loss and gradients and
    plain SGD at lr / (1 - momentum) on its sampled rows (float16: within its rounding), rows not
    sampled bit-identical, and that no momentum array exists to write."""
    from sample_fc.pfc.device_head import DeviceHead
    from sample_fc.pfc.row_storage import Storage
    rng = np.random.default_rng(4)
    index, target = np.array([0, 3, 4, 8, 11, 15]), np.array([2, 0, 5, -1, 2])
    embeddings = rng.standard_normal((5, 6)).astype(np.float32)
    optimizer = MemoryBankSGDOptimizer(lambda step: 0.02, momentum=0.9, wd=0.01)
    tolerance = 1e-5 if dtype == "float32" else 2e-3
    for kernel in (HostHead, DeviceHead):
        bank = MemoryBank(16, 6, mx.cpu(), seed=5, storage=Storage(dtype, "none"))
        weight0 = bank.to_numpy()[0].astype(np.float64)
        head = kernel(bank, optimizer, allreduce_max=_identity, allreduce_sum=_identity)
        loss, grad_x = head.forward_backward(mx.nd.array(embeddings), Sample(index, target), 5,
                                             CombinedMargin(*MARGINS))
        head.update(1)
        want_loss, want_x, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index], target,
                                                        *MARGINS)
        ref.assert_close(loss.asnumpy(), [want_loss], 1e-5)
        ref.assert_close(grad_x.asnumpy(), want_x, 1e-5)
        weight = bank.to_numpy()[0]
        step = 0.02 / (1 - 0.9) * (want_w + 0.01 * weight0[index])
        ref.assert_close(weight[index] - weight0[index], -step, tolerance, err_msg=kernel.__name__)
        untouched = np.setdiff1d(np.arange(16), index)
        np.testing.assert_array_equal(weight[untouched], weight0[untouched])
        assert bank.momenta == [] and not bank.to_numpy()[1].any()


def test_host_head_with_logit_offsets_matches_numpy():
    """Test that the host kernel adds the sampled-softmax offsets to the logits: loss, d/d
    embeddings and the updated rows equal the float64 NumPy head given the same offsets."""
    bank = _bank(20, 5)
    weight0, momentum0 = bank.weight.asnumpy(), bank.momentum.asnumpy()
    index = np.array([1, 2, 6, 7, 9, 13, 14, 19])
    target = np.array([0, 7, 3, -1, 3, 5])
    offsets = np.where(np.isin(np.arange(8), target), 0.0, np.log(15 / 4)).astype(np.float32)
    embeddings = np.random.default_rng(4).standard_normal((6, 5)).astype(np.float32)
    head = _host_head(bank, MemoryBankSGDOptimizer(lambda step: 0.2))
    loss, grad_x = head.forward_backward(mx.nd.array(embeddings), Sample(index, target, logit_offsets=offsets), 6,
                                         CombinedMargin(*MARGINS))
    head.update(1)
    want_loss, want_x, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index], target,
                                                    *MARGINS, offsets=offsets)
    plain_loss, _, _ = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index], target, *MARGINS)
    assert abs(want_loss - plain_loss) > 0.1
    want_weight, _ = ref.sgd_momentum(weight0[index], want_w, momentum0[index], 0.2, 0.9, 5e-4)
    ref.assert_close(loss.asnumpy(), [want_loss], 1e-5)
    ref.assert_close(grad_x.asnumpy(), want_x, 1e-5)
    ref.assert_close(bank.weight.asnumpy()[index], want_weight, 1e-5)


@pytest.mark.parametrize("form", ["mxnet", "pytorch"])
def test_host_head_decay_scales_multiply_each_rows_weight_decay(monkeypatch, form):
    """Test that with decay scales (the weight-decay correction: 1 on the target columns, F / n
    on the negatives) each updated row decays with wd times its scale, in blocks shared by two
    threads: the rows equal the NumPy SGD with that per-row wd, and differ from a uniform wd."""
    monkeypatch.setattr(host_head, "BLOCK_ROWS", 3)
    bank = _bank(20, 5)
    bank.weight[:] = mx.nd.array(np.random.default_rng(7).standard_normal((20, 5)))   # rows of norm ~2
    weight0, momentum0 = bank.weight.asnumpy(), bank.momentum.asnumpy()
    index = np.array([1, 2, 6, 7, 9, 13, 14, 19])
    target = np.array([0, 7, 3, -1, 3, 5])
    scales = np.where(np.isin(np.arange(8), target), 1.0, 15 / 4).astype(np.float32)
    embeddings = np.random.default_rng(6).standard_normal((6, 5)).astype(np.float32)
    head = _host_head(bank, MemoryBankSGDOptimizer(lambda step: 0.2, wd=0.05, momentum_form=form), threads=2)
    head.forward_backward(mx.nd.array(embeddings), Sample(index, target, decay_scales=scales), 6, CombinedMargin(*MARGINS))
    head.update(1)
    _, _, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index], target, *MARGINS)
    sgd = ref.sgd_momentum if form == "mxnet" else ref.sgd_momentum_pytorch
    want_weight, want_momentum = sgd(weight0[index], want_w, momentum0[index], 0.2, 0.9, 0.05 * scales[:, None])
    uniform_weight, _ = sgd(weight0[index], want_w, momentum0[index], 0.2, 0.9, 0.05)
    ref.assert_close(bank.weight.asnumpy()[index], want_weight, 1e-5)
    ref.assert_close(bank.momentum.asnumpy()[index], want_momentum, 1e-5)
    assert np.abs(want_weight - uniform_weight).max() > 100 * 1e-5 * np.abs(want_weight).max()


def test_host_head_whole_shard_updates_the_bank_in_place():
    """Test that when every row is sampled (ratio 1.0) the update lands in the bank and
    equals the NumPy reference."""
    bank = _bank(7, 4)
    weight0, momentum0 = bank.weight.asnumpy(), bank.momentum.asnumpy()
    embeddings = np.random.default_rng(2).standard_normal((5, 4)).astype(np.float32)
    target = np.array([0, 6, 2, 2, 5])
    head = _host_head(bank, MemoryBankSGDOptimizer(lambda step: 0.1))
    loss, _ = head.forward_backward(mx.nd.array(embeddings), Sample(np.arange(7), target), 5, CombinedMargin(*MARGINS))
    head.update(1)
    want_loss, _, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0, target, *MARGINS)
    want_weight, want_momentum = ref.sgd_momentum(weight0, want_w, momentum0, 0.1, 0.9, 5e-4)
    ref.assert_close(loss.asnumpy(), [want_loss], 1e-5)
    ref.assert_close(bank.weight.asnumpy(), want_weight, 1e-5)
    ref.assert_close(bank.momentum.asnumpy(), want_momentum, 1e-5)


def test_host_head_rejects_a_bad_index():
    """Test that an out-of-range or unsorted index is an error naming the valid range
    (np.take's clip mode would otherwise clamp it silently)."""
    head = _host_head(_bank(5, 3), MemoryBankSGDOptimizer(lambda step: 0.1))
    for index in (np.array([0, 5]), np.array([3, 1])):
        with pytest.raises(ValueError, match=r"sorted distinct rows in \[0, 5\)"):
            head.forward_backward(mx.nd.ones((2, 3)), Sample(index, np.array([0, 1])), 2, CombinedMargin())


def test_host_view_shares_memory_and_keeps_the_array_alive():
    """Test that a host view reads and writes the NDArray's own memory, that the NDArray is not
    freed while a view of it lives (dropping every other reference, then writing through the
    view), and that a GPU array is refused with a message naming its context."""
    import gc
    array = mx.nd.zeros((3, 2))
    view = host_view(array)
    view[1] = 5.0
    np.testing.assert_array_equal(array.asnumpy(), [[0, 0], [5, 5], [0, 0]])
    array[2] = 7.0
    mx.nd.waitall()
    assert view[2, 0] == 7.0
    handle = array.handle.value
    part = view[1:]
    del array, view
    gc.collect()
    buffer = part
    while not hasattr(buffer, "owner"):          # view -> ... -> the ctypes buffer
        buffer = buffer.base
    assert buffer.owner.handle.value == handle    # the NDArray itself, still alive
    part[0] = 3.0
    np.testing.assert_array_equal(buffer.owner.asnumpy()[1], [3, 3])
    with pytest.raises(ValueError, match="gpu"):
        host_view(_FakeGpuArray())


def test_default_threads(monkeypatch):
    """Test that the update threads follow OMP_NUM_THREADS when set, else the cores shared by
    this machine's ranks (at least 1)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert host_head.default_threads(2) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(host_head.os, "cpu_count", lambda: 8)
    assert (host_head.default_threads(1), host_head.default_threads(4), host_head.default_threads(16)) == (8, 2, 1)
    with pytest.raises(ValueError, match="threads must be an integer >= 1, got 0"):
        _host_head(_bank(3, 2), MemoryBankSGDOptimizer(lambda step: 0.1), threads=0)


class _FakeGpuArray:
    context = mx.gpu(0)
