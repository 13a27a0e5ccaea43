"""Tests for sample_fc.pfc.device_head: the device kernel's loss and gradients against the NumPy reference."""
import mxnet as mx
import numpy as np
import pytest

import reference as ref
from sample_fc.pfc.device_head import head_forward_backward, row_dots
from sample_fc.pfc.margin import CombinedMargin


def _identity(array, name):
    return array


@pytest.mark.parametrize("corrected", [False, True])
def test_head_matches_numpy_reference(corrected):
    """Test that loss, d/d embeddings and d/d weights equal the float64 NumPy head, including
    a row whose target lives on another rank (-1), with and without logit offsets (the
    sampled-softmax correction: 0 on the target columns 0, 3, 5, 8)."""
    rng = np.random.default_rng(5)
    embeddings, weights = rng.standard_normal((6, 5)), rng.standard_normal((9, 5)) * 0.1
    target = np.array([0, 8, 3, -1, 3, 5])
    margins = (1.0, 0.5, 0.0, 16.0)
    offsets = np.array([0, 2.3, 2.3, 0, 2.3, 0, 2.3, 2.3, 0]) if corrected else None
    loss, grad_x, grad_w = head_forward_backward(
        mx.nd.array(embeddings, dtype="float64"), mx.nd.array(weights, dtype="float64"),
        mx.nd.array(target, dtype="int64"), CombinedMargin(*margins), 6, _identity, _identity,
        logit_offsets=None if offsets is None else mx.nd.array(offsets, dtype="float64"))
    want_loss, want_x, want_w = ref.head_loss_grads(embeddings, weights, target, *margins, offsets=offsets)
    np.testing.assert_allclose(loss.asscalar(), want_loss, rtol=1e-10)
    np.testing.assert_allclose(grad_x.asnumpy(), want_x, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(grad_w.asnumpy(), want_w, rtol=1e-8, atol=1e-12)


def test_row_dots():
    """Test that row_dots gives the per-row inner products as a column."""
    a, b = np.arange(12.0).reshape(3, 4), np.ones((3, 4)) * 2
    np.testing.assert_array_equal(row_dots(mx.nd.array(a), mx.nd.array(b)).asnumpy(),
                                  (a * b).sum(axis=1, keepdims=True))
