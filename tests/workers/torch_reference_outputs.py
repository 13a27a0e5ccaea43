"""Run sample_fc's backbones in MXNet and the PyTorch reference networks
(bench/torch_reference.py) with equal weights, and the reference margin, and save
what tests/test_torch_reference.py compares: `python torch_reference_outputs.py OUT.npz`.

A process of its own: torch must be imported before horovod.mxnet (the other order crashes
in torch's import: both carry Gloo), and the test process has imported Horovod by then.

Saved per network N (32 px, D 16, 4 random images, inference mode): N/mxnet and N/torch
(embeddings), N/mxnet_params and N/torch_params (counts); mbf_small with one PReLU slope
changed in the reference only: changed/mxnet, changed/torch; and margin/cosine,
margin/labels, margin/<s>_<m1>_<m2>_<m3> (the reference's logits); curricular/cosine, loss, grad, t
(CurricularFace at s 16, m 0.5 from t 0.3: the mean loss, its gradient and the updated t).
"""
import sys

import torch  # noqa: F401  (first: see above)
import mxnet as mx
import numpy as np

from bench import torch_reference
from sample_fc.initializers import backbone_initializer
from sample_fc import symbols

IMAGE_SIZE, EMBEDDING = 32, 16
MARGINS = ((64.0, 1.0, 0.5, 0.0), (32.0, 1.0, 0.0, 0.25), (30.0, 1.0, 0.3, 0.2))


def random_mxnet_backbone(name, rng):
    """Backbone `name` bound for inference: PyTorch-style random weights, with random BN
    statistics, betas, gammas, biases and PReLU slopes so that every parameter matters."""
    sym = symbols.get_symbol(name, EMBEDDING, IMAGE_SIZE, "float32", 0.0)
    module = mx.mod.Module(sym, data_names=("data",), label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", (4, 3, IMAGE_SIZE, IMAGE_SIZE))], for_training=False)
    mx.random.seed(1)
    module.init_params(initializer=backbone_initializer("pytorch"))
    arg, aux = module.get_params()
    aux = {k: mx.nd.array(rng.uniform(0.5, 1.5, v.shape) if k.endswith("var") else rng.normal(0, 0.1, v.shape))
           for k, v in aux.items()}
    arg = {k: mx.nd.array(v.asnumpy() + rng.normal(0, 0.05, v.shape)) if k.endswith(("beta", "gamma", "bias"))
           else v for k, v in arg.items()}
    arg["embeddings_gamma"] = mx.nd.ones(arg["embeddings_gamma"].shape)      # fix_gamma: always 1
    module.set_params(arg, aux)
    return sym, module, arg, aux


def copy_into(model, sym, arg, aux):
    """Copy the MXNet parameters and BN statistics into `model`, matched in order; each pair
    must hold the same number of values."""
    mx_args = [a for a in sym.list_arguments() if a != "data"]
    params = list(model.parameters())
    buffers = [b for n, b in model.named_buffers() if "num_batches" not in n]
    if len(params) != len(mx_args) or len(buffers) != len(sym.list_auxiliary_states()):
        raise SystemExit(f"{len(params)} parameters and {len(buffers)} buffers in PyTorch, "
                         f"{len(mx_args)} and {len(sym.list_auxiliary_states())} in MXNet")
    with torch.no_grad():
        for tensor, name in list(zip(params, mx_args)) + list(zip(buffers, sym.list_auxiliary_states())):
            value = (arg[name] if name in arg else aux[name]).asnumpy()
            if value.size != tensor.numel():
                raise SystemExit(f"{name}: {value.size} values in MXNet, {tensor.numel()} in PyTorch")
            tensor.copy_(torch.from_numpy(value.reshape(tensor.shape)))


def both_outputs(name, change=None):
    """(MXNet embeddings, reference embeddings, MXNet params, reference params) on the same
    pixels; change(arg) alters the reference's copy of the weights only."""
    rng = np.random.default_rng(0)
    sym, module, arg, aux = random_mxnet_backbone(name, rng)
    model = torch_reference.network(name, EMBEDDING, IMAGE_SIZE).eval()
    copy_into(model, sym, change(arg) if change else arg, aux)
    pixels = rng.uniform(0, 255, (4, 3, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    module.forward(mx.io.DataBatch([mx.nd.array(pixels)]), is_train=False)
    with torch.no_grad():
        got = model(torch.from_numpy(pixels)).numpy()
    return (module.get_outputs()[0].asnumpy(), got, sum(v.size for v in arg.values()),
            sum(p.numel() for p in model.parameters()))


def main(out):
    saved = {}
    for name in torch_reference.networks():
        (saved[f"{name}/mxnet"], saved[f"{name}/torch"], saved[f"{name}/mxnet_params"],
         saved[f"{name}/torch_params"]) = both_outputs(name)
    slope = "stage2_unit3_expand_prelu_gamma"
    saved["changed/mxnet"], saved["changed/torch"], _, _ = both_outputs(
        "mbf_small", lambda arg: dict(arg, **{slope: arg[slope] + 1.0}))
    rng = np.random.default_rng(2)
    saved["margin/cosine"], saved["margin/labels"] = rng.uniform(-0.9, 0.9, (5, 7)), rng.integers(0, 7, 5)
    for s, m1, m2, m3 in MARGINS:
        saved[f"margin/{s}_{m1}_{m2}_{m3}"] = torch_reference.margin_logits(
            torch.from_numpy(saved["margin/cosine"]), torch.from_numpy(saved["margin/labels"]), s, m1, m2, m3).numpy()
    cosine = torch.tensor(saved["margin/cosine"] * 1.05, requires_grad=True)   # some negatives above cos(theta_y + m)
    loss, t = torch_reference.curricular_loss(cosine, torch.from_numpy(saved["margin/labels"]), 16.0, 0.5, 0.3)
    loss.backward()
    saved["curricular/cosine"], saved["curricular/loss"] = cosine.detach().numpy(), loss.detach().numpy()
    saved["curricular/grad"], saved["curricular/t"] = cosine.grad.numpy(), np.array(t)
    try:
        torch_reference.network("r152", EMBEDDING, IMAGE_SIZE)
    except ValueError as err:
        saved["unknown_network_error"] = np.array(str(err))
    np.savez(out, **saved)


if __name__ == "__main__":
    main(sys.argv[1])
