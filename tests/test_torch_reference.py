"""The PyTorch reference trainer of sample_fc/bench/compare.py trains the same network and
margin as sample_fc: checked here with equal weights (skipped where torch is not installed;
it is only needed for that benchmark: `.venv/bin/pip install torch==2.13.0`)."""
import mxnet as mx
import numpy as np
import pytest

import symbols
from sample_fc.initializers import backbone_initializer

torch = pytest.importorskip("torch")
from sample_fc.bench import torch_reference  # noqa: E402  (needs torch)


def test_reference_mobilefacenet_equals_the_mxnet_symbol_with_the_same_weights():
    """Test that torch_reference.MobileFaceNet, given the MXNet mbf's parameters and BN
    statistics (matched in order, shapes checked), gives the same embeddings on the same raw
    pixels in inference mode, and that both have the same parameter count."""
    sym = symbols.get_symbol("mbf", 16, 32, "float32", 0.0)
    module = mx.mod.Module(sym, data_names=("data",), label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", (4, 3, 32, 32))], for_training=False)
    mx.random.seed(1)
    module.init_params(initializer=backbone_initializer("pytorch"))
    arg, aux = module.get_params()
    rng = np.random.default_rng(0)
    aux = {k: mx.nd.array(rng.uniform(0.5, 1.5, v.shape) if k.endswith("var") else rng.normal(0, 0.1, v.shape))
           for k, v in aux.items()}
    arg = {k: mx.nd.array(v.asnumpy() + rng.normal(0, 0.05, v.shape)) if k.endswith(("beta", "prelu_gamma"))
           else v for k, v in arg.items()}
    arg["embeddings_gamma"] = mx.nd.ones(arg["embeddings_gamma"].shape)      # fix_gamma: always 1
    module.set_params(arg, aux)

    model = torch_reference.MobileFaceNet(16, 32).eval()
    mx_args = [a for a in sym.list_arguments() if a != "data"]
    params = list(model.parameters())
    buffers = [b for n, b in model.named_buffers() if "num_batches" not in n]
    assert len(params) == len(mx_args) and len(buffers) == len(sym.list_auxiliary_states())
    with torch.no_grad():
        for tensor, name in list(zip(params, mx_args)) + list(zip(buffers, sym.list_auxiliary_states())):
            value = (arg[name] if name in arg else aux[name]).asnumpy()
            assert value.size == tensor.numel(), name
            tensor.copy_(torch.from_numpy(value.reshape(tensor.shape)))
    pixels = rng.uniform(0, 255, (4, 3, 32, 32)).astype(np.float32)
    module.forward(mx.io.DataBatch([mx.nd.array(pixels)]), is_train=False)
    want = module.get_outputs()[0].asnumpy()
    with torch.no_grad():
        got = model(torch.from_numpy(pixels)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_reference_margin_is_the_combined_margin():
    """Test that torch_reference.margin_logits gives s*(cos(m1*theta+m2)-m3) at the target and
    s*cos elsewhere (NumPy formula), for ArcFace and CosFace margins."""
    rng = np.random.default_rng(2)
    cosine = rng.uniform(-0.9, 0.9, (5, 7))
    labels = rng.integers(0, 7, 5)
    for s, m1, m2, m3 in ((64.0, 1.0, 0.5, 0.0), (32.0, 1.0, 0.0, 0.25), (30.0, 1.0, 0.3, 0.2)):
        got = torch_reference.margin_logits(torch.from_numpy(cosine), torch.from_numpy(labels), s, m1, m2, m3)
        want = s * cosine.copy()
        rows = np.arange(5)
        want[rows, labels] = s * (np.cos(m1 * np.arccos(cosine[rows, labels]) + m2) - m3)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-9)
