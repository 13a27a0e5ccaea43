"""Tests for sample_fc.pfc.partial_fc: the options record, the sample it hands the kernels, its bytes."""
import dataclasses
import json
import math

import mxnet as mx
import numpy as np
import pytest

import default
import reference as ref
from sample_fc.pfc.row_storage import Storage
from sample_fc.pfc.device_head import DeviceHead
from sample_fc.pfc.head import HostHead
from sample_fc.errors import UsageError
from sample_fc.pfc.partial_fc import PartialFC, PartialFCOptions, uses_host_kernel
from sample_fc.pfc.sampler import ClassCenterSampler


class _OneProcess:
    """The softmax's collectives in one process: identities."""
    @staticmethod
    def allreduce_max(array, name):
        return array

    @staticmethod
    def allreduce_sum(array, name):
        return array


def test_options_come_from_the_config_and_are_frozen():
    """Test that every option is the config key of its name (the demo's values, not the library's
    defaults) and that the record cannot be changed after it is built."""
    cfg = default.get_config("demo")
    cfg.sample_wd_correction, cfg.margin_warmup_steps = True, 7
    options = PartialFCOptions.from_config(cfg)
    for field in dataclasses.fields(PartialFCOptions):
        assert getattr(options, field.name) == cfg[field.name], field.name
    assert options.momentum_form == "pytorch" != PartialFCOptions().momentum_form
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.sample_ratio = 0.5


def test_peak_ratio_is_the_warmups_start_when_larger():
    """Test that the memory plan's ratio is the warm-up's start while a warm-up exists, else the ratio."""
    assert PartialFCOptions(sample_ratio=0.1).peak_ratio() == 0.1
    assert PartialFCOptions(sample_ratio=0.1, sample_ratio_warmup_steps=5).peak_ratio() == 1.0
    assert PartialFCOptions(sample_ratio=0.4, sample_ratio_warmup_steps=5,
                            sample_ratio_warmup_start=0.2).peak_ratio() == 0.4


@pytest.mark.parametrize("logit_correction, decay_correction", [(False, False), (True, False), (False, True),
                                                                (True, True)])
def test_the_sample_carries_each_correction_when_it_is_on(logit_correction, decay_correction):
    """Test that the sampler's Sample holds log(F / n) offsets and F / n decay scales on its
    negatives (0 and 1 on the batch's positives), computed by hand, exactly when each option is on."""
    sampler = ClassCenterSampler(100, 50, 10, seed=1, logit_correction=logit_correction,
                                 decay_correction=decay_correction)
    labels = np.array([100, 103, 103, 149, 7, 260])          # 3 local positives, 2 elsewhere
    sample = sampler(labels)
    positives = np.isin(sample.index, [0, 3, 49])
    assert len(sample.index) == 10 and positives.sum() == 3
    inverse_q = (50 - 3) / (10 - 3)                           # F free classes, n negatives drawn
    if logit_correction:
        np.testing.assert_allclose(sample.logit_offsets, np.where(positives, 0.0, math.log(inverse_q)), rtol=1e-6)
    else:
        assert sample.logit_offsets is None
    if decay_correction:
        np.testing.assert_allclose(sample.decay_scales, np.where(positives, 1.0, inverse_q), rtol=1e-6)
    else:
        assert sample.decay_scales is None


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_a_step_of_the_layer_equals_the_numpy_head(kernel):
    """Test that forward_backward + update at update 3 of a margin warm-up over 6 updates
    gives the NumPy reference's loss, embedding gradient and bank rows with the warmed-in
    margin (m2 = 0.25), and that only the sampled rows moved."""
    options = PartialFCOptions(sample_ratio=0.5, loss_m2=0.5, loss_s=8.0, margin_warmup_steps=6,
                               head_kernel=kernel, seed=3)
    layer = PartialFC.for_rank(20, 0, 1, 5, mx.cpu(), options, lambda step: 0.1, collectives=_OneProcess,
                               threads=1)
    assert layer.margin_schedule(3).m2 == 0.25 and layer.margin_schedule(6).m2 == 0.5
    weight0, momentum0 = (array.copy() for array in layer.bank.to_numpy())
    embeddings = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    labels = np.array([0, 4, 4, 11, 19, 2])
    drawn = []
    sampler = layer.sampler
    layer.sampler = lambda batch, update: drawn.append(sampler(batch, update)) or drawn[-1]
    loss, grad = layer.forward_backward(mx.nd.array(embeddings), labels, 3)
    layer.update(3)
    index, targets = drawn[0].index, drawn[0].targets
    assert len(index) == 10 and set(labels) <= set(index)
    want_loss, want_x, want_w = ref.head_loss_grads(embeddings.astype(np.float64), weight0[index], targets,
                                                    1.0, 0.25, 0.0, 8.0)
    want_weight, want_momentum = ref.sgd_momentum(weight0[index], want_w, momentum0[index], 0.1, 0.9, 5e-4)
    weight, momentum = layer.bank.to_numpy()
    ref.assert_close(loss.asnumpy(), [want_loss], 1e-5)
    ref.assert_close(grad.asnumpy(), want_x, 1e-5)
    ref.assert_close(weight[index], want_weight, 1e-5)
    ref.assert_close(momentum[index], want_momentum, 1e-5)
    others = np.setdiff1d(np.arange(20), index)
    np.testing.assert_array_equal(weight[others], weight0[others])


def test_a_discarded_step_changes_no_row():
    """Test that discard() after forward_backward leaves the bank as it was (a skipped step)."""
    layer = PartialFC.for_rank(12, 0, 1, 4, mx.cpu(), PartialFCOptions(seed=2), lambda step: 0.5,
                               collectives=_OneProcess, threads=1)
    before = [array.copy() for array in layer.bank.to_numpy()]
    layer.forward_backward(mx.nd.ones((3, 4)), np.array([1, 5, 9]), 1)
    layer.discard()
    for was, now in zip(before, layer.bank.to_numpy()):
        np.testing.assert_array_equal(was, now)


def test_memory_bytes_by_hand():
    """Test the layer's bytes on a hand-computed case: 1,000 classes per rank at ratio 0.1 (K = 100
    > B = 64), D 8, float16 bank; the host kernel with 2 threads and the device kernel."""
    host = PartialFC.memory_bytes(1000, 64, 8, 0.1, storage=Storage("float16"), host_kernel=True, threads=2)
    assert host == {"bank": 2 * 1000 * 8 * 2, "sampler": 9 * 1000 + 8 * 100, "sampled": 100,
                    "head": 4 * (100 * 8 + 2 * 64 * 100 + 3 * 64 * 8 + 3 * 2 * 512 * 8)}
    device = PartialFC.memory_bytes(1000, 64, 8, 0.1, storage=Storage("float16"), host_kernel=False)
    assert device["head"] == 4 * (6 * 100 * 8 + 8 * 64 * 100)
    whole = PartialFC.memory_bytes(1000, 64, 8, 1.0, host_kernel=True, threads=1)
    assert whole["sampled"] == 1000 and whole["head"] == 4 * (2 * 64 * 1000 + 3 * 64 * 8 + 3 * 512 * 8)
    positives = PartialFC.memory_bytes(1000, 256, 8, 0.1)          # the sample grows to every positive
    assert positives["sampled"] == 256


def test_kernel_choice():
    """Test that auto runs a CPU bank of float32 or float16 on the host and a GPU bank on the device."""
    assert uses_host_kernel("auto", "cpu", Storage("float16")) and uses_host_kernel("auto", "cpu", Storage("float32"))
    assert not uses_host_kernel("auto", "gpu", Storage("float32"))
    with pytest.raises(UsageError, match="head_kernel=host .* bank is on the GPU: set bank_context=cpu"):
        uses_host_kernel("host", "gpu", Storage("float32"))
    assert not uses_host_kernel("device", "cpu", Storage("float32"))
    for kernel, head in (("auto", HostHead), ("device", DeviceHead)):
        layer = PartialFC.for_rank(4, 0, 1, 2, mx.cpu(), PartialFCOptions(head_kernel=kernel), lambda step: 0.1,
                                   collectives=_OneProcess, threads=1)
        assert type(layer.head) is head
    with pytest.raises(ValueError, match="head_kernel must be one of"):
        PartialFC.for_rank(4, 0, 1, 2, mx.cpu(), PartialFCOptions(head_kernel="gpu"), lambda step: 0.1,
                           collectives=_OneProcess, threads=1)


def test_int8_momentum_needs_the_host_kernel_and_no_momentum_runs_on_both():
    """Test that a layer with bank_momentum int8 or none builds its bank that way and runs on the
    host kernel (auto or host); that int8 momentum on a GPU bank or with head_kernel=device is
    refused in one line naming the setting and the fix, before anything is allocated; and that
    a bank without momentum (what `auto` picks for many classes) runs on the device kernel too,
    a GPU bank's included."""
    for storage in ("int8", "none"):
        assert uses_host_kernel("auto", "cpu", Storage("float16", storage))
        assert uses_host_kernel("host", "cpu", Storage("float32", storage))
        layer = PartialFC.for_rank(4, 0, 1, 2, mx.cpu(), PartialFCOptions(bank_momentum=storage), lambda step: 0.1,
                                   collectives=_OneProcess, threads=1)
        assert type(layer.head) is HostHead and layer.bank.storage.momentum == storage
    with pytest.raises(UsageError, match="bank_momentum=int8 needs the bank in host memory .* bank is on "
                                         r"the GPU: set bank_context=cpu, or bank_momentum=same \(or none\)"):
        uses_host_kernel("auto", "gpu", Storage("float16", "int8"))
    with pytest.raises(UsageError, match="bank_momentum=int8 runs on the host kernel only, and this run "
                                         r"has head_kernel=device: set head_kernel=auto, or bank_momentum=same \(or none\)"):
        uses_host_kernel("device", "cpu", Storage("float32", "int8"))
    with pytest.raises(UsageError, match="runs on the host kernel only"):
        PartialFC.for_rank(4, 0, 1, 2, mx.cpu(), PartialFCOptions(bank_momentum="int8", head_kernel="device"),
                           lambda step: 0.1, collectives=_OneProcess, threads=1)
    assert not uses_host_kernel("auto", "gpu", Storage("float16", "none"))
    assert not uses_host_kernel("device", "cpu", Storage("float32", "none"))
    layer = PartialFC.for_rank(4, 0, 1, 2, mx.cpu(), PartialFCOptions(bank_momentum="none", head_kernel="device"),
                               lambda step: 0.1, collectives=_OneProcess, threads=1)
    assert type(layer.head) is DeviceHead and layer.bank.momenta == []


def test_memory_bytes_count_the_momentum_as_stored():
    """Test the layer's bank bytes with int8 momentum (D + 4 ceil(D / 64) bytes a row) and none
    (0), and that at ratio 1.0 only a float32 bank with its momentum stored as the weights is
    read in place (no K x D rows in the head)."""
    same = PartialFC.memory_bytes(1000, 64, 100, 1.0, host_kernel=True, threads=1)
    int8 = PartialFC.memory_bytes(1000, 64, 100, 1.0, storage=Storage(momentum="int8"), host_kernel=True, threads=1)
    none = PartialFC.memory_bytes(1000, 64, 100, 1.0, storage=Storage("float16", "none"), host_kernel=True, threads=1)
    assert same["bank"] == 1000 * 2 * 4 * 100 and int8["bank"] == 1000 * (4 * 100 + 100 + 4 * 2)
    assert none["bank"] == 1000 * 2 * 100
    assert int8["head"] == same["head"] + 4 * 1000 * 100 == none["head"]


def test_the_layer_state_door_carries_the_sampler_and_the_margin():
    """Test that PartialFC.state_dict after two CurricularFace steps, JSON round-tripped and loaded
    into a fresh layer, gives the next step's sample and running mean t of the first layer; that a
    state without the sampler (a resume on another split) leaves the fresh layer's sampler as it
    was while taking the margin's; and that a state without a margin (an older checkpoint) loads."""
    options = PartialFCOptions(sample_ratio=0.3, loss_margin="curricularface", loss_m2=0.5, loss_s=8.0, seed=4,
                               margin_warmup_steps=0)

    def layer():
        return PartialFC.for_rank(40, 0, 1, 5, mx.cpu(), options, lambda step: 0.1, collectives=_OneProcess, threads=1)
    first, rng = layer(), np.random.default_rng(2)
    batches = [rng.integers(0, 40, 6) for _ in range(3)]
    for step in (1, 2):
        first.forward_backward(mx.nd.array(rng.standard_normal((6, 5)).astype(np.float32)), batches[step - 1], step)
        first.update(step)
    state = json.loads(json.dumps(first.state_dict()))
    assert set(state) == {"sampler", "margin"} and state["margin"]["t"] != 0.0
    second, fresh = layer(), layer()
    second.load_state_dict(state)
    assert second.margin_schedule.target.state.t == first.margin_schedule.target.state.t
    following = first.sampler(batches[2], 3).index
    np.testing.assert_array_equal(second.sampler(batches[2], 3).index, following)
    fresh.load_state_dict({"margin": state["margin"]})
    unmoved = fresh.sampler(batches[2], 3).index
    np.testing.assert_array_equal(unmoved, layer().sampler(batches[2], 3).index)
    assert not np.array_equal(unmoved, following)
    assert fresh.margin_schedule.target.state.t == first.margin_schedule.target.state.t
    layer().load_state_dict({})
