"""The PyTorch reference networks and margin (bench/torch_reference.py, the trainer
of bench/compare.py) are sample_fc's: checked with equal weights. torch (CPU build)
is a test dependency (scripts/test.sh installs requirements-test.txt). The outputs come from
tests/workers/torch_reference_outputs.py, run in a process of its own: torch cannot be
imported after horovod.mxnet, which this test process has imported by now."""
import subprocess
import sys

import numpy as np
import pytest

from sample_fc import symbols
from conftest import REPO

# torch_reference.networks(), which imports torch: the networks of its FAMILIES (a ViT's oracle is
# tests/workers/arcface_torch_models.py); the worker's outputs are checked to hold exactly these
REFERENCE_NETWORKS = tuple(name for name in symbols.NETWORKS
                           if symbols.network(name).family in ("iresnet", "mobilefacenet"))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The worker's saved arrays (see its docstring)."""
    out = tmp_path_factory.mktemp("torch_reference") / "outputs.npz"
    result = subprocess.run([sys.executable, str(REPO / "tests" / "workers" / "torch_reference_outputs.py"), str(out)],
                            capture_output=True, text=True, timeout=600, cwd=str(REPO))
    assert result.returncode == 0, result.stderr[-3000:]
    saved = dict(np.load(out))
    assert {key[:-len("/mxnet")] for key in saved if key.endswith("/mxnet")} - {"changed"} == set(REFERENCE_NETWORKS)
    return saved


@pytest.mark.parametrize("name", REFERENCE_NETWORKS)
def test_reference_network_equals_the_mxnet_symbol_with_the_same_weights(outputs, name):
    """Test that torch_reference.network(name), given the MXNet symbol's parameters and BN
    statistics (matched in order, sizes checked), has the same parameter count and gives the
    same embeddings (within 1e-4 of their largest value) on the same raw pixels in inference
    mode."""
    assert outputs[f"{name}/mxnet_params"] == outputs[f"{name}/torch_params"]
    want, got = outputs[f"{name}/mxnet"], outputs[f"{name}/torch"]
    assert want.shape == (4, 16) and np.abs(want).max() > 1e-3          # a real signal, not zeros
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_reference_network_differs_when_a_weight_differs(outputs):
    """Test that the comparison above can fail: one changed slope of one PReLU changes the
    reference's embeddings beyond the tolerance."""
    want, got = outputs["changed/mxnet"], outputs["changed/torch"]
    assert np.abs(got - want).max() > 1e-3 * np.abs(want).max()


def test_reference_of_an_unknown_network_is_an_error(outputs):
    """Test that a network without a reference is a ValueError naming it."""
    assert "'r152'" in str(outputs["unknown_network_error"])


@pytest.mark.parametrize("s,m1,m2,m3", [(64.0, 1.0, 0.5, 0.0), (32.0, 1.0, 0.0, 0.25), (30.0, 1.0, 0.3, 0.2)])
def test_reference_margin_is_the_combined_margin(outputs, s, m1, m2, m3):
    """Test that torch_reference.margin_logits gives s*(cos(m1*theta+m2)-m3) at the target and
    s*cos elsewhere (NumPy formula), for ArcFace, CosFace and combined margins."""
    cosine, labels = outputs["margin/cosine"], outputs["margin/labels"]
    want = s * cosine.copy()
    rows = np.arange(len(labels))
    want[rows, labels] = s * (np.cos(m1 * np.arccos(cosine[rows, labels]) + m2) - m3)
    np.testing.assert_allclose(outputs[f"margin/{s}_{m1}_{m2}_{m3}"], want, rtol=1e-9)


def _curricular_on_our_kernels(cosine, labels):
    """(loss, d loss / d cosine, t after) of both head kernels' softmax with CurricularFace(0.5,
    s 16) from t 0.3, one process (identity collectives)."""
    import mxnet as mx
    from sample_fc.pfc.head import HostHead
    from sample_fc.pfc.margin import CurricularFace, CurricularState
    from sample_fc.pfc.memory_bank import MemoryBank
    from sample_fc.pfc.device_head import margin_softmax_backward, margin_softmax_forward
    rows = len(labels)
    device = CurricularFace(0.5, 16.0, CurricularState(0.3))
    loss_rows, cache = margin_softmax_forward(mx.nd.array(cosine), mx.nd.array(labels, dtype="int64"), device)
    grad = margin_softmax_backward(cache, mx.nd.full((rows,), 1.0 / rows))
    host = CurricularFace(0.5, 16.0, CurricularState(0.3))
    head = HostHead(MemoryBank(4, 2, mx.cpu()), None, allreduce_max=lambda a, n: a, allreduce_sum=lambda a, n: a)
    host_loss, host_grad = head._margin_softmax(cosine.astype(np.float32), labels, rows, host)
    return ((float(loss_rows.mean().asscalar()), grad.asnumpy(), device.state.t),
            (host_loss, host_grad.copy(), host.state.t))


def test_curricularface_on_both_kernels_is_the_papers_loss(outputs):
    """Test that CurricularFace on the device and the host kernel gives the PyTorch reference's
    loss, gradient on every cosine (hard negatives reweighted by t + 2c, the target by
    cos(theta + m)') and updated t; and that the case has hard negatives and differs from ArcFace's
    loss, so ignoring them would fail."""
    cosine, labels = outputs["curricular/cosine"], outputs["margin/labels"]
    target = cosine[np.arange(len(labels)), labels]
    shifted = np.cos(np.arccos(np.clip(target, -1, 1)) + 0.5)
    hard = cosine > shifted[:, None]
    hard[np.arange(len(labels)), labels] = False
    assert hard.sum() >= 3
    for loss, grad, t in _curricular_on_our_kernels(cosine, labels):
        np.testing.assert_allclose(loss, outputs["curricular/loss"], rtol=1e-5)
        np.testing.assert_allclose(grad, outputs["curricular/grad"], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(t, outputs["curricular/t"], rtol=1e-6)
    from sample_fc.pfc.device_head import margin_cross_entropy
    import mxnet as mx
    arcface = margin_cross_entropy(mx.nd.array(cosine), mx.nd.array(labels, dtype="int64"), 1.0, 0.5, 0.0, 16.0)
    assert abs(float(arcface.asscalar()) - float(outputs["curricular/loss"])) > 1e-2
