"""Tests for the margin softmax cross-entropy (sample_fc.pfc.device_head / margin_cross_entropy)."""
import mxnet as mx
import numpy as np
import pytest

import reference as ref
from sample_fc.pfc.device_head import margin_cross_entropy

CASES = {"arcface": (1.0, 0.5, 0.0), "cosface": (1.0, 0.0, 0.4), "combined": (1.3, 0.2, 0.15)}


def _loss_and_grad(cosine, labels, margins, scale, dtype="float32", reduction="mean"):
    c = mx.nd.array(cosine, dtype=dtype)
    c.attach_grad()
    with mx.autograd.record():
        loss = margin_cross_entropy(c, mx.nd.array(labels, dtype="int64"), *margins,
                                    scale=scale, reduction=reduction)
    loss.backward()
    return loss.asnumpy(), c.grad.asnumpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_loss_and_grad_match_numpy(name):
    """Test that loss and d loss / d cosine equal the NumPy reference to 1e-5."""
    rng = np.random.default_rng(1)
    cosine = rng.uniform(-0.95, 0.95, size=(16, 40))
    labels = rng.integers(0, 40, size=16)
    labels[3] = -1                                   # a row whose target lives elsewhere
    loss, grad = _loss_and_grad(cosine, labels, CASES[name], 30.0, dtype="float64")
    want_loss, want_grad = ref.softmax_loss_grad(cosine, labels, *CASES[name], 30.0)
    np.testing.assert_allclose(loss[0], want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_matches_finite_differences(name):
    """Test that the hand-written backward equals central finite differences of the forward."""
    rng = np.random.default_rng(2)
    cosine = rng.uniform(-0.9, 0.9, size=(4, 6))
    labels = np.array([0, 5, 2, -1])
    _, grad = _loss_and_grad(cosine, labels, CASES[name], 8.0, dtype="float64")
    step = 1e-6
    numeric = np.zeros_like(cosine)
    for i, j in np.ndindex(*cosine.shape):
        plus, minus = cosine.copy(), cosine.copy()
        plus[i, j] += step
        minus[i, j] -= step
        numeric[i, j] = (_loss_and_grad(plus, labels, CASES[name], 8.0, "float64")[0][0]
                         - _loss_and_grad(minus, labels, CASES[name], 8.0, "float64")[0][0]) / (2 * step)
    np.testing.assert_allclose(grad, numeric, rtol=1e-4, atol=1e-7)


def test_gradient_finite_at_cos_plus_minus_one():
    """Test that ArcFace gradients stay finite when target cosines are exactly 1 and -1."""
    cosine = np.array([[1.0, 0.2, -0.3], [-1.0, 0.5, 0.1], [0.3, -1.0, 1.0]])
    loss, grad = _loss_and_grad(cosine, np.array([0, 0, 2]), CASES["arcface"], 64.0)
    assert np.isfinite(loss).all() and np.isfinite(grad).all(), grad


def test_no_saturation_when_target_far_below():
    """Test that a hopeless row gives the exact log-sum-exp loss, far above -log(1e-30) = 69.08."""
    cosine = np.full((2, 1000), 1.0)
    cosine[:, 0] = -1.0
    labels = np.array([0, 0])
    loss, grad = _loss_and_grad(cosine, labels, CASES["arcface"], 64.0)
    want, _ = ref.softmax_loss_grad(cosine, labels, *CASES["arcface"], 64.0)
    assert want > 69.08 * 1.5
    np.testing.assert_allclose(loss[0], want, rtol=1e-5)
    assert np.isfinite(grad).all()


def test_reductions_and_softmax():
    """Test that 'none' gives per-row losses, 'sum' their sum, and the softmax rows sum to 1."""
    rng = np.random.default_rng(3)
    cosine = rng.uniform(-1, 1, size=(5, 7))
    labels = np.array([1, 2, 3, 4, 5])
    rows, _ = ref.softmax_loss_rows(cosine, labels, *CASES["cosface"], 16.0)
    none, _ = _loss_and_grad(cosine, labels, CASES["cosface"], 16.0, "float64", reduction="none")
    total, _ = _loss_and_grad(cosine, labels, CASES["cosface"], 16.0, "float64", reduction="sum")
    np.testing.assert_allclose(none, rows, rtol=1e-6)
    np.testing.assert_allclose(total[0], rows.sum(), rtol=1e-6)
    _, probs = margin_cross_entropy(mx.nd.array(cosine), mx.nd.array(labels, dtype="int32"),
                                    return_softmax=True)
    np.testing.assert_allclose(probs.asnumpy().sum(axis=1), 1.0, rtol=1e-5)


def test_float_labels_rejected():
    """Test that float labels are refused with a message naming the dtype."""
    with pytest.raises(TypeError, match="float32"):
        margin_cross_entropy(mx.nd.zeros((2, 3)), mx.nd.array([0, 1]))
    with pytest.raises(ValueError, match="reduction.*'avg'"):
        margin_cross_entropy(mx.nd.zeros((2, 3)), mx.nd.array([0, 1], dtype="int32"), reduction="avg")
