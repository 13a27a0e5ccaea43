"""Tests for sample_fc.rounding and float16 banks: unbiased rounding, and a float16 bank whose
updates are far below float16's resolution still moving as the float32 bank does, on average."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc.head import DeviceHead
from sample_fc.host_head import HostHead
from sample_fc.margin import CombinedMargin
from sample_fc.memory_bank import MemoryBank
from sample_fc.optimizers import MemoryBankSGDOptimizer
from sample_fc.rounding import noise, stochastic_round_to_float16


def _identity(array, name):
    return array


def test_rounding_picks_a_neighbour_keeps_exact_values_and_the_mean():
    """Test that every value becomes one of its two float16 neighbours (NumPy's nextafter), a
    value float16 holds exactly stays itself, NDArrays round exactly as NumPy arrays, and the
    mean of many roundings of 1 + 1e-5 (nearest: 1) is 1 + 1e-5 within its standard error."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_000) * rng.choice([1e-6, 1e-3, 0.04, 3.0, 1000.0], 100_000)).astype(np.float32)
    u = noise(0, 1, 0, 0, x.shape)
    y = stochastic_round_to_float16(x, u)
    assert y.dtype == np.float16
    nearest = x.astype(np.float16)
    below = np.minimum(nearest, np.nextafter(nearest, np.float16(-np.inf)))
    above = np.maximum(nearest, np.nextafter(nearest, np.float16(np.inf)))
    assert np.all((y == nearest) | ((y == below) & (x < nearest)) | ((y == above) & (x > nearest)))
    exact = np.array([1.0, 0.5, -2.0, 0.0, 65504.0, 2.0 ** -24, -3 * 2.0 ** -24, 2.0 ** -14], np.float32)
    np.testing.assert_array_equal(stochastic_round_to_float16(exact, noise(0, 1, 0, 0, exact.shape)), exact)
    np.testing.assert_array_equal(stochastic_round_to_float16(mx.nd.array(x), u).asnumpy(), y)
    for target in (1.0 + 1e-5, 1.0 - 1e-5, -3e-3 + 1e-8, 2.5e-6, -7.1e-8):       # the last two: subnormal
        many = np.full(200_000, target, np.float32)
        rounded = stochastic_round_to_float16(many, noise(1, 1, 0, 0, many.shape)).astype(np.float64)
        spacing = abs(float(np.nextafter(np.float16(target), np.float16(np.inf))) - float(np.float16(target)))
        assert abs(rounded.mean() - float(np.float32(target))) < 4 * spacing / np.sqrt(len(many))


def test_noise_is_a_pure_function_of_its_key():
    """Test that the noise repeats for the same (seed, update, class, stream), differs
    otherwise, and covers the 13 dropped bits."""
    a = noise(3, 10, 500, 0, (4, 8))
    wide = noise(3, 10, 500, 0, (100_000,))
    assert wide.dtype == np.uint32 and wide.min() == 0 and wide.max() == 2 ** 13 - 1
    np.testing.assert_array_equal(a, noise(3, 10, 500, 0, (4, 8)))
    for other in (noise(3, 11, 500, 0, (4, 8)), noise(3, 10, 501, 0, (4, 8)), noise(3, 10, 500, 1, (4, 8))):
        assert not np.array_equal(a, other)


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_a_float16_bank_moves_as_the_float32_bank_under_tiny_updates(kernel):
    """Test that 100 steps whose updates are mostly far below a float16 spacing (the median
    step is under 1/20 of the median spacing, so round-to-nearest would keep most centers where
    they are) move a float16 bank (either kernel) as they move the float32 bank, on average:
    the regression slope of its movement on the float32 bank's is 1 within 5%."""
    moved, steps = {}, {}
    for dtype in ("float32", "float16"):
        bank = MemoryBank(256, 16, mx.cpu(), seed=3, dtype=dtype)
        start = bank.to_numpy()[0].astype(np.float64)
        optimizer = MemoryBankSGDOptimizer(lambda step: 2e-8, momentum=0.0, wd=0.0, momentum_form="mxnet")
        head = (HostHead if kernel == "host" else DeviceHead)(bank, optimizer, allreduce_max=_identity,
                                                              allreduce_sum=_identity)
        embeddings = mx.nd.array(np.random.default_rng(0).standard_normal((64, 16)))
        for step in range(1, 101):
            head.forward_backward(embeddings, np.arange(64) * 4, np.arange(256), 64, CombinedMargin(1.0, 0.0, 0.0, 16.0))
            head.update(step)
        moved[dtype] = bank.to_numpy()[0].astype(np.float64) - start
        steps[dtype] = np.abs(moved[dtype]) / 100
        if dtype == "float16":
            spacing = np.spacing(np.abs(start).astype(np.float16)).astype(np.float64)
            assert np.median(steps["float32"]) < np.median(spacing) / 20
            nearest_keeps = np.mean(steps["float32"] < spacing / 2)
            assert nearest_keeps > 0.9                   # nearest rounding: 90%+ entries never move
    slope = np.sum(moved["float16"] * moved["float32"]) / np.sum(moved["float32"] ** 2)
    assert abs(slope - 1.0) < 0.05, slope
