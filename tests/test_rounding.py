"""Tests for sample_fc.pfc.rounding and float16 banks: unbiased rounding, the C kernel held to the NumPy
definitions bit for bit, and a float16 bank whose updates are far below float16's resolution
still moving as the float32 bank does, on average."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc.pfc.row_storage import Storage
from sample_fc.pfc import rounding
from sample_fc.pfc.device_head import DeviceHead
from sample_fc.pfc.head import HostHead
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.memory_bank import MemoryBank
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer
from sample_fc.pfc.rounding import noise, round_rows, rounding_key, stochastic_round_to_float16
from sample_fc.pfc.sampler import Sample


def _identity(array, name):
    return array


def _noise_of(x, seed=0):
    return noise(rounding_key(seed, 1, 0), np.arange(x.shape[0]), x.shape[1])


def test_rounding_picks_a_neighbour_keeps_exact_values_and_the_mean():
    """Test that every value becomes one of its two float16 neighbours (NumPy's nextafter), a
    value float16 holds exactly stays itself, and the mean of many roundings of 1 + 1e-5
    (nearest: 1) is 1 + 1e-5 within its standard error (also for subnormal values)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((1000, 100)) * rng.choice([1e-6, 1e-3, 0.04, 3.0, 1000.0], (1000, 100))).astype(np.float32)
    y = stochastic_round_to_float16(x, _noise_of(x))
    assert y.dtype == np.float16
    nearest = x.astype(np.float16)
    below = np.minimum(nearest, np.nextafter(nearest, np.float16(-np.inf)))
    above = np.maximum(nearest, np.nextafter(nearest, np.float16(np.inf)))
    assert np.all((y == nearest) | ((y == below) & (x < nearest)) | ((y == above) & (x > nearest)))
    exact = np.array([[1.0, 0.5, -2.0, 0.0, 65504.0, 2.0 ** -24, -3 * 2.0 ** -24, 2.0 ** -14]], np.float32)
    np.testing.assert_array_equal(stochastic_round_to_float16(exact, _noise_of(exact)), exact)
    for target in (1.0 + 1e-5, 1.0 - 1e-5, -3e-3 + 1e-8, 2.5e-6, -7.1e-8):       # the last two: subnormal
        many = np.full((2000, 100), target, np.float32)
        rounded = stochastic_round_to_float16(many, _noise_of(many, seed=1)).astype(np.float64)
        spacing = abs(float(np.nextafter(np.float16(target), np.float16(np.inf))) - float(np.float16(target)))
        assert abs(rounded.mean() - float(np.float32(target))) < 4 * spacing / np.sqrt(many.size)


def test_noise_is_a_pure_function_of_seed_update_stream_class_and_column():
    """Test that the noise of an entry repeats for the same (seed, update, stream, class), does not
    depend on the other rows asked for, differs when any part of the key differs, and covers
    the 13 dropped bits."""
    key = rounding_key(3, 10, 0)
    a = noise(key, [500, 501, 7], 9)
    assert a.dtype == np.uint32 and a.shape == (3, 9)
    np.testing.assert_array_equal(a[1:2], noise(key, [501], 9))
    np.testing.assert_array_equal(a[:, :5], noise(key, [500, 501, 7], 5))
    wide = noise(key, np.arange(1000), 100)
    assert wide.min() == 0 and wide.max() == 2 ** 13 - 1
    assert abs(wide.mean() - (2 ** 13 - 1) / 2) < 20
    for other in (rounding_key(4, 10, 0), rounding_key(3, 11, 0), rounding_key(3, 10, 1)):
        assert not np.array_equal(a, noise(other, [500, 501, 7], 9))
    assert not np.array_equal(a[0], a[1])


def test_the_c_kernel_is_built_and_matches_the_numpy_definitions(monkeypatch):
    """Test that the bootstrap built sample_fc.pfc._half_rows, and that its take, put and round give
    the NumPy definitions' bits (NaN, inf, overflow, subnormals and odd widths included); that
    the NumPy fallback (no extension) gives the same; and that a row outside the block is
    refused before anything is written."""
    assert rounding._half_rows is not None, "sample_fc.pfc._half_rows not built: run pip install -e ."
    rng = np.random.default_rng(1)
    for width in (3, 37, 512):
        x = (rng.standard_normal((200, width)) *
             rng.choice([1e-9, 1e-6, 1e-3, 0.04, 3.0, 1000.0, 7e4], (200, width))).astype(np.float32)
        x[0, :3] = [np.nan, np.inf, -np.inf]
        classes = rng.integers(0, 10 ** 10, 200)
        key = rounding_key(5, 17, 1)
        expected = stochastic_round_to_float16(x, noise(key, classes, width))
        block = (rng.standard_normal((500, width)) * 0.01).astype(np.float16)
        rows = np.sort(rng.choice(500, 200, replace=False))
        results = {}
        for built in (True, False):
            if not built:
                monkeypatch.setattr(rounding, "_half_rows", None)
            rounded = round_rows(x, classes, key)
            target = block.copy()
            rounding.put_rows(target, rows, x, classes, key)
            taken = np.empty((200, width), np.float32)
            rounding.take_rows(target, rows, taken)
            results[built] = (rounded, target, taken)
            np.testing.assert_array_equal(rounded.view(np.uint16), expected.view(np.uint16))
            np.testing.assert_array_equal(target[rows].view(np.uint16), expected.view(np.uint16))
            untouched = np.setdiff1d(np.arange(500), rows)
            np.testing.assert_array_equal(target[untouched].view(np.uint16), block[untouched].view(np.uint16))
            np.testing.assert_array_equal(taken, target[rows].astype(np.float32))
        monkeypatch.undo()
    block = np.zeros((4, 8), np.float16)
    with pytest.raises(IndexError, match="row 4 of a block of 4 rows"):
        rounding.put_rows(block, [1, 4], np.ones((2, 8), np.float32), [1, 4], 0)
    assert not block.any()


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_a_float16_bank_moves_as_the_float32_bank_under_tiny_updates(kernel):
    """Test that 100 steps whose updates are mostly far below a float16 spacing (the median
    step is under 1/20 of the median spacing, so round-to-nearest would keep most centers where
    they are) move a float16 bank (either kernel) as they move the float32 bank, on average:
    the regression slope of its movement on the float32 bank's is 1 within 5%."""
    moved, steps = {}, {}
    for dtype in ("float32", "float16"):
        bank = MemoryBank(256, 16, mx.cpu(), seed=3, storage=Storage(dtype))
        start = bank.to_numpy()[0].astype(np.float64)
        optimizer = MemoryBankSGDOptimizer(lambda step: 2e-8, momentum=0.0, wd=0.0, momentum_form="mxnet")
        head = (HostHead if kernel == "host" else DeviceHead)(bank, optimizer, allreduce_max=_identity,
                                                              allreduce_sum=_identity)
        embeddings = mx.nd.array(np.random.default_rng(0).standard_normal((64, 16)))
        for step in range(1, 101):
            head.forward_backward(embeddings, Sample(np.arange(256), np.arange(64) * 4), 64, CombinedMargin(1.0, 0.0, 0.0, 16.0))
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
