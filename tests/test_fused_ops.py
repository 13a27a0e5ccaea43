"""The fused PReLU operator (sample_fc/_mx_ops.cc) and the graph rewrite (sample_fc/fused_ops.py):
the operator against NumPy's definition, the rewritten networks against the composite ones
they replace, and the library loading in the processes training runs in (Horovod first)."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import symbols
from sample_fc import fused_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def numpy_prelu(x, gamma, dy):
    """y, dx, dgamma by the definition (float64 sums for dgamma)."""
    slope = gamma.reshape((1, -1) + (1,) * (x.ndim - 2))
    y = np.where(x > 0, x, slope * x).astype(np.float32)
    dx = np.where(x > 0, dy, slope * dy).astype(np.float32)
    axes = (0,) + tuple(range(2, x.ndim))
    dgamma = (dy.astype(np.float64) * np.minimum(x, 0).astype(np.float64)).sum(axis=axes)
    return y, dx, dgamma


def run_op(x, gamma, dy):
    """The operator's forward and backward through MXNet's executor."""
    data = mx.sym.Variable("x")
    slope = mx.sym.Variable("g")
    out = mx.sym.sample_fc_prelu(data, slope)
    grads = {"x": mx.nd.zeros(x.shape), "g": mx.nd.zeros(gamma.shape)}
    executor = out.bind(mx.cpu(), {"x": mx.nd.array(x), "g": mx.nd.array(gamma)}, args_grad=grads)
    executor.forward(is_train=True)
    executor.backward(mx.nd.array(dy))
    return executor.outputs[0].asnumpy(), grads["x"].asnumpy(), grads["g"].asnumpy()


def test_the_library_is_built_and_loads():
    assert fused_ops.library_path(), "sample_fc/_mx_ops*.so is not built (pip install -e . builds it)"
    assert fused_ops.available()


@pytest.mark.parametrize("shape", [(4, 3, 5, 7), (2, 19, 16, 16), (3, 8), (1, 9, 1, 1), (64, 16, 8, 8)])
def test_operator_equals_the_definition(shape):
    assert fused_ops.available()
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[::7] = 0.0                             # exact zeros take the negative side's gradient
    channels = shape[1]
    gamma = rng.uniform(-0.5, 1.5, (channels, 1, 1, 1)).astype(np.float32)   # slopes of either sign
    dy = rng.standard_normal(shape).astype(np.float32)
    y, dx, dgamma = run_op(x, gamma, dy)
    want_y, want_dx, want_dgamma = numpy_prelu(x, gamma.reshape(-1), dy)
    assert np.array_equal(y, want_y)
    assert np.array_equal(dx, want_dx)
    np.testing.assert_allclose(dgamma.reshape(-1), want_dgamma, rtol=1e-5, atol=1e-5)


def test_operator_refuses_a_gamma_of_the_wrong_size():
    assert fused_ops.available()
    with pytest.raises(mx.MXNetError, match="gamma hold C elements"):
        mx.nd.sample_fc_prelu(mx.nd.ones((2, 3, 4, 4)), mx.nd.ones((4,))).wait_to_read()


def graph_ops(symbol):
    return [node["op"] for node in json.loads(symbol.tojson())["nodes"]]


@pytest.mark.parametrize("network,prelus", [("mbf_small", 33), ("r18", 9)])
def test_fuse_replaces_each_prelu_and_keeps_the_parameters(network, prelus):
    composite = symbols.get_symbol(network, 32, 32)
    fused = fused_ops.fuse(composite)
    ops = graph_ops(fused)
    assert ops.count(fused_ops.OP_NAME) == prelus
    assert "clip" not in ops and "relu" not in ops
    assert graph_ops(composite).count("clip") == prelus          # the saved form is untouched
    assert fused.list_arguments() == composite.list_arguments()
    assert fused.list_auxiliary_states() == composite.list_auxiliary_states()
    assert fused.list_outputs() == composite.list_outputs()


def forward_backward(symbol, arg_params, aux_params, data, head_grad):
    module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", data.shape)], for_training=True)
    module.set_params(arg_params, aux_params)
    module.forward(mx.io.DataBatch([mx.nd.array(data)]), is_train=True)
    module.backward([mx.nd.array(head_grad)])
    names = symbol.list_arguments()[1:]
    grads = {name: grad[0].asnumpy() for name, grad in zip(names, module._exec_group.grad_arrays)}
    return module.get_outputs()[0].asnumpy(), grads


@pytest.mark.parametrize("network", ["mbf_small", "r18"])
def test_a_fused_network_trains_as_the_composite_one(network):
    """The same outputs and gradients up to float rounding: the operator's own values are the
    composite's bits (test above), but oneDNN may choose another kernel for the next layer when
    its input no longer comes from a convolution (measured: r18 differs by ~1e-6, mbf_small not)."""
    composite = symbols.get_symbol(network, 16, 32)
    rng = np.random.default_rng(3)
    arg_shapes, _, aux_shapes = composite.infer_shape(data=(4, 3, 32, 32))
    arg_params = {name: mx.nd.array(rng.standard_normal(shape).astype(np.float32) * 0.1)
                  for name, shape in zip(composite.list_arguments(), arg_shapes) if name != "data"}
    for name in arg_params:
        if name.endswith("_gamma") and arg_params[name].ndim == 4:     # PReLU slopes: realistic values
            arg_params[name] = mx.nd.array(rng.uniform(0.1, 0.4, arg_params[name].shape).astype(np.float32))
    aux_params = {name: mx.nd.ones(shape) if name.endswith("var") else mx.nd.zeros(shape)
                  for name, shape in zip(composite.list_auxiliary_states(), aux_shapes)}
    data = rng.uniform(0, 255, (4, 3, 32, 32)).astype(np.float32)
    head_grad = rng.standard_normal((4, 16)).astype(np.float32)
    out_c, grads_c = forward_backward(composite, arg_params, aux_params, data, head_grad)
    out_f, grads_f = forward_backward(fused_ops.fuse(composite), arg_params, aux_params, data, head_grad)
    np.testing.assert_allclose(out_f, out_c, rtol=0, atol=1e-5 * np.abs(out_c).max())
    everything_c = np.concatenate([g.ravel() for g in grads_c.values()])
    everything_f = np.concatenate([grads_f[name].ravel() for name in grads_c])
    assert np.linalg.norm(everything_f - everything_c) <= 1e-5 * np.linalg.norm(everything_c)
    scale = np.abs(everything_c).max()     # per parameter, against the largest gradient: some
    for name in grads_c:                   # (BN betas near the output) are sums that nearly cancel
        assert np.abs(grads_c[name] - grads_f[name]).max() <= 1e-4 * scale, name


def run_python(code, env=None):
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, **(env or {})))
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_library_loads_after_horovod():
    """horovod.mxnet loads libmxnet.so with RTLD_GLOBAL: without -Bsymbolic and -fno-gnu-unique
    the library's lib_api bound to libmxnet's own copy and crashed at load (SIGFPE)."""
    out = run_python("import horovod.mxnet, mxnet as mx\n"
                     "from sample_fc import fused_ops\n"
                     "assert fused_ops.available()\n"
                     "x = mx.nd.array([[-2.0, 3.0]]).reshape((1, 2, 1))\n"
                     "print(mx.nd.sample_fc_prelu(x, mx.nd.array([0.5, 0.25])).asnumpy().ravel().tolist())")
    assert out.strip().splitlines()[-1] == "[-1.0, 3.0]"


def test_slope_gradients_do_not_depend_on_the_thread_count(tmp_path):
    code = ("import sys, numpy as np, mxnet as mx\n"
            "from sample_fc import fused_ops\n"
            "assert fused_ops.available()\n"
            "rng = np.random.default_rng(0)\n"
            "x = mx.nd.array(rng.standard_normal((32, 24, 16, 16)).astype(np.float32))\n"
            "g = mx.nd.array(np.full((24, 1, 1, 1), 0.25, np.float32))\n"
            "x.attach_grad(); g.attach_grad()\n"
            "with mx.autograd.record():\n"
            "    y = mx.nd.sample_fc_prelu(x, g)\n"
            "y.backward(mx.nd.array(rng.standard_normal((32, 24, 16, 16)).astype(np.float32)))\n"
            "np.save(%r, g.grad.asnumpy())\n")
    one, two = tmp_path / "one.npy", tmp_path / "two.npy"
    run_python(code % str(one), {"OMP_NUM_THREADS": "1"})
    run_python(code % str(two), {"OMP_NUM_THREADS": "2"})
    assert np.array_equal(np.load(one), np.load(two))


def test_without_the_library_fuse_keeps_the_composite_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(fused_ops, "_library", {})
    monkeypatch.setattr(fused_ops, "library_path", lambda: None)
    composite = symbols.get_symbol("mbf_small", 16, 32)
    with caplog.at_level("WARNING"):
        assert fused_ops.fuse(composite) is composite
        assert fused_ops.fuse(composite) is composite
    warnings = [r.getMessage() for r in caplog.records if "fused CPU operators" in r.getMessage()]
    assert len(warnings) == 1 and "it is not built" in warnings[0] and "bootstrap.sh" in warnings[0]


def test_a_cut_short_library_is_not_loaded_and_is_named(tmp_path, monkeypatch, caplog):
    """dlopen of a truncated library kills the process (SIGBUS): it is checked first."""
    whole = fused_ops.library_path()
    assert fused_ops.whole_elf(whole)
    cut = tmp_path / os.path.basename(whole)
    cut.write_bytes(open(whole, "rb").read()[:100000])
    assert not fused_ops.whole_elf(str(cut))
    (tmp_path / "text.so").write_text("not a library")
    assert not fused_ops.whole_elf(str(tmp_path / "text.so"))
    monkeypatch.setattr(fused_ops, "_library", {})
    monkeypatch.setattr(fused_ops, "library_path", lambda: str(cut))
    with caplog.at_level("WARNING"):
        assert not fused_ops.available()
    assert f"{cut} is damaged" in caplog.text and "bootstrap.sh" in caplog.text
