"""The fused PReLU, grouped 3x3 conv, LayerNorm, attention and clip operators (sample_fc/_mx_ops.cc)
and the graph rewrite (sample_fc/fused_ops.py): the operators against NumPy's definitions (and the conv against MXNet's
Convolution), the rewritten networks against the composite ones they replace, and the library
loading in the processes training runs in (Horovod first)."""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
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


def numpy_group_conv(x, w, dy, groups):
    """y, dx, dw of the grouped 3x3 conv (stride 1, pad 1, no bias) by its definition, in float64:
    each of the 9 taps a shifted window of the zero-padded planes."""
    n, channels, height, width = x.shape
    k = channels // groups
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    padded = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y, dx_padded, dw = np.zeros(x.shape), np.zeros(padded.shape), np.zeros(w.shape)
    for g in range(groups):
        for o in range(k):
            for i in range(k):
                for a in range(3):
                    for b in range(3):
                        tap = w64[g * k + o, i, a, b]
                        window = padded[:, g * k + i, a:a + height, b:b + width]
                        y[:, g * k + o] += window * tap
                        dx_padded[:, g * k + i, a:a + height, b:b + width] += dy64[:, g * k + o] * tap
                        dw[g * k + o, i, a, b] = (dy64[:, g * k + o] * window).sum()
    return y, dx_padded[:, :, 1:-1, 1:-1], dw


def run_symbol(out, x, w, dy):
    """out(x, w)'s forward and backward (dx, dw) through MXNet's executor."""
    grads = {"x": mx.nd.zeros(x.shape), "w": mx.nd.zeros(w.shape)}
    executor = out.bind(mx.cpu(), {"x": mx.nd.array(x), "w": mx.nd.array(w)}, args_grad=grads)
    executor.forward(is_train=True)
    executor.backward(mx.nd.array(dy))
    return executor.outputs[0].asnumpy(), grads["x"].asnumpy(), grads["w"].asnumpy()


def group_conv_case(shape, groups, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], shape[1] // groups, 3, 3)).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    return x, w, dy


GROUP_CONV_CASES = [((2, 8, 5, 7), 4),        # k = 2, odd sides
                    ((1, 4, 1, 1), 2),        # one pixel, N = 1: only the centre tap
                    ((1, 6, 1, 9), 3),        # one row
                    ((3, 6, 16, 16), 3),
                    ((2, 16, 9, 4), 4),       # k = 4
                    ((2, 6, 4, 3), 1),        # one group of 6
                    ((4, 128, 16, 16), 64)]   # mbf's stem_dw_conv, large enough for OpenMP


@pytest.mark.parametrize("shape,groups", GROUP_CONV_CASES)
def test_group_conv_equals_the_definition(shape, groups):
    assert fused_ops.available()
    x, w, dy = group_conv_case(shape, groups, sum(shape) + groups)
    out = mx.sym.sample_fc_group_conv3x3(mx.sym.Variable("x"), mx.sym.Variable("w"), num_group=groups)
    for got, want in zip(run_symbol(out, x, w, dy), numpy_group_conv(x, w, dy, groups)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("shape,groups", GROUP_CONV_CASES)
def test_group_conv_equals_mxnet_convolution(shape, groups):
    assert fused_ops.available()
    x, w, dy = group_conv_case(shape, groups, 7 * sum(shape))
    data, weight = mx.sym.Variable("x"), mx.sym.Variable("w")
    ours = run_symbol(mx.sym.sample_fc_group_conv3x3(data, weight, num_group=groups), x, w, dy)
    theirs = run_symbol(mx.sym.Convolution(data, weight, num_filter=shape[1], num_group=groups, kernel=(3, 3),
                                           stride=(1, 1), pad=(1, 1), no_bias=True), x, w, dy)
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("data,weight,dtype,message", [
    ((2, 8, 4, 4), (8, 1, 3, 3), "float32", r"weight must be \(C, C/num_group, 3, 3\) = \(8, 2, 3, 3\) "
                                            r"for data \(2, 8, 4, 4\) and num_group = 4, got \(8, 1, 3, 3\)"),
    ((2, 8, 4, 4), (8, 2, 5, 5), "float32",
     r"= \(8, 2, 3, 3\) for data \(2, 8, 4, 4\) and num_group = 4, got \(8, 2, 5, 5\)"),
    ((2, 10, 4, 4), (10, 2, 3, 3), "float32", "the 10 channels of data do not divide into num_group = 4 groups"),
    ((2, 8, 4, 4), (8, 2, 3, 3), "float16", "sample_fc_group_conv3x3 takes float32 data and weight"),
])
def test_group_conv_refuses_what_it_does_not_compute(data, weight, dtype, message):
    """(lib_api keeps every error message of the process in each new error: the messages here
    name the shapes, so that an earlier test's refusal does not match.)"""
    assert fused_ops.available()
    with pytest.raises(mx.MXNetError, match=message):
        mx.nd.sample_fc_group_conv3x3(mx.nd.ones(data, dtype=dtype), mx.nd.ones(weight, dtype=dtype),
                                      num_group=4).wait_to_read()


def numpy_layer_norm(x, gamma, beta, dy, eps):
    """y, dx, dgamma, dbeta of LayerNorm over the last axis by its definition, in float64."""
    x64, g64, dy64 = (a.astype(np.float64) for a in (x, gamma, dy))
    mean = x64.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    xhat = (x64 - mean) * rstd
    g_dy = g64 * dy64
    dx = rstd * (g_dy - g_dy.mean(axis=-1, keepdims=True) - xhat * (g_dy * xhat).mean(axis=-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return xhat * g64 + beta, dx, (dy64 * xhat).sum(axis=rows), dy64.sum(axis=rows)


def run_layer_norm(out, x, gamma, beta, dy):
    """out(x, g, b)'s forward and backward (dx, dgamma, dbeta) through MXNet's executor."""
    grads = {"x": mx.nd.zeros(x.shape), "g": mx.nd.zeros(gamma.shape), "b": mx.nd.zeros(beta.shape)}
    executor = out.bind(mx.cpu(), {"x": mx.nd.array(x), "g": mx.nd.array(gamma), "b": mx.nd.array(beta)},
                        args_grad=grads)
    executor.forward(is_train=True)
    executor.backward(mx.nd.array(dy))
    return executor.outputs[0].asnumpy(), grads["x"].asnumpy(), grads["g"].asnumpy(), grads["b"].asnumpy()


def layer_norm_case(shape, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)          # rows of non-zero mean
    gamma = rng.uniform(0.5, 1.5, shape[-1]).astype(np.float32)
    beta = rng.standard_normal(shape[-1]).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    return x, gamma, beta, dy


LAYER_NORM_CASES = [(4, 7, 16), (3, 256), (1, 1, 5), (2, 49, 256), (5, 17, 33)]    # (2, 49, 256): OpenMP


@pytest.mark.parametrize("shape", LAYER_NORM_CASES)
def test_layer_norm_equals_the_definition(shape):
    assert fused_ops.available()
    x, gamma, beta, dy = layer_norm_case(shape, sum(shape))
    out = mx.sym.sample_fc_layer_norm(mx.sym.Variable("x"), mx.sym.Variable("g"), mx.sym.Variable("b"), eps=1e-5)
    for got, want in zip(run_layer_norm(out, x, gamma, beta, dy), numpy_layer_norm(x, gamma, beta, dy, 1e-5)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("shape", LAYER_NORM_CASES)
def test_layer_norm_equals_mxnet_layer_norm(shape):
    assert fused_ops.available()
    x, gamma, beta, dy = layer_norm_case(shape, 3 * sum(shape))
    args = (mx.sym.Variable("x"), mx.sym.Variable("g"), mx.sym.Variable("b"))
    ours = run_layer_norm(mx.sym.sample_fc_layer_norm(*args, eps=2e-5), x, gamma, beta, dy)
    theirs = run_layer_norm(mx.sym.LayerNorm(*args, axis=-1, eps=2e-5), x, gamma, beta, dy)
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("gamma, eps, message", [((7,), "1e-5", "gamma and beta must hold 8 elements"),
                                                  ((8,), "0", "eps must be a positive number, got '0'"),
                                                  ((8,), "x", "eps must be a positive number, got 'x'")])
def test_layer_norm_refuses_what_it_does_not_compute(gamma, eps, message):
    assert fused_ops.available()
    with pytest.raises(mx.MXNetError, match=message):
        mx.nd.sample_fc_layer_norm(mx.nd.ones((2, 8)), mx.nd.ones(gamma), mx.nd.ones(gamma), eps=eps).wait_to_read()


def test_fuse_replaces_each_layer_norm_over_the_last_axis_whose_statistics_nothing_reads():
    """A ViT's 25 LayerNorms (12 blocks x 2 and the final one) become the operator, with their
    names, inputs and eps; a LayerNorm over another axis, or whose mean output is read, stays."""
    fused = fused_ops.fuse(symbols.get_symbol("vit_t_dp005_mask0", 16, 32), (2, 3, 32, 32))
    nodes = json.loads(fused.tojson())["nodes"]
    norms = [node for node in nodes if node["op"] == fused_ops.LAYER_NORM_OP_NAME]
    assert len(norms) == 25 and "LayerNorm" not in graph_ops(fused)
    assert {node["attrs"]["eps"] for node in norms} == {"1e-05"}
    assert [nodes[entry[0]]["name"] for entry in norms[0]["inputs"][1:]] == ["block0_norm1_gamma", "block0_norm1_beta"]
    data = mx.sym.Variable("data")
    other_axis = mx.sym.LayerNorm(data, axis=1, name="other_axis")
    read_mean = mx.sym.LayerNorm(data, output_mean_var=True, name="read_mean")
    plain = mx.sym.LayerNorm(data, name="plain")
    kept = mx.sym.Group([other_axis, read_mean[1], plain])
    nodes = json.loads(fused_ops.fuse(kept, (2, 4, 8)).tojson())["nodes"]
    assert [node["name"] for node in nodes if node["op"] == fused_ops.LAYER_NORM_OP_NAME] == ["plain"]


def test_layer_norm_results_do_not_depend_on_the_thread_count(tmp_path):
    """dgamma and dbeta: each thread sums whole column blocks over the rows in order; y and dx:
    whole rows."""
    one, two = results_at_one_and_two_threads(tmp_path, (32, 49, 256), (256,), "rng.uniform(0.5, 1.5, 256)",
                                              "mx.nd.sample_fc_layer_norm(x, p, p * 0.5, eps=1e-5)")
    for name in ("y", "dx", "dp"):
        assert np.array_equal(one[name], two[name]), name


def numpy_attention(qkv, key_bias, dout, heads):
    """out, dqkv, dkey_bias of multi-head self-attention from a fused qkv (N, L, 3W) by its
    definition, in float64: softmax(q k^T / sqrt(d) + key_bias) v, heads joined."""
    n, tokens, width3 = qkv.shape
    width = width3 // 3
    d = width // heads
    q, k, v = qkv.astype(np.float64).reshape(n, tokens, 3, heads, d).transpose(2, 0, 3, 1, 4)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    if key_bias is not None:
        scores = scores + key_bias.reshape(n, heads, 1, tokens)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = (p @ v).transpose(0, 2, 1, 3).reshape(n, tokens, width)
    dmixed = dout.astype(np.float64).reshape(n, tokens, heads, d).transpose(0, 2, 1, 3)
    dp = dmixed @ v.transpose(0, 1, 3, 2)
    dscores = p * (dp - (p * dp).sum(-1, keepdims=True))
    dq, dk = dscores @ k / np.sqrt(d), dscores.transpose(0, 1, 3, 2) @ q / np.sqrt(d)
    dv = p.transpose(0, 1, 3, 2) @ dmixed
    dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(n, tokens, width3)
    return out, dqkv, dscores.sum(2).reshape(n * heads, 1, tokens)


def attention_case(n, tokens, width, heads, masked, seed):
    rng = np.random.default_rng(seed)
    qkv = (rng.standard_normal((n, tokens, 3 * width)) * 2).astype(np.float32)
    left_out = rng.random((n, 1, tokens)) < 0.3
    key_bias = np.where(left_out, -1e9, 0.0).repeat(heads, axis=0).astype(np.float32) if masked else None
    return qkv, key_bias, rng.standard_normal((n, tokens, width)).astype(np.float32)


def run_attention(qkv, key_bias, dout, heads):
    """The operator's out, dqkv (and dkey_bias) through autograd."""
    args = [mx.nd.array(qkv)] + ([] if key_bias is None else [mx.nd.array(key_bias)])
    for arg in args:
        arg.attach_grad()
    with mx.autograd.record():
        out = mx.nd.sample_fc_attention(*args, heads=heads, key_bias=int(key_bias is not None))
    out.backward(mx.nd.array(dout))
    return [out.asnumpy()] + [arg.grad.asnumpy() for arg in args]


# (N, L, W, heads, masked): vit_t's blocks at 64 px (49 tokens, 8 heads of 32), odd sizes, one token
ATTENTION_CASES = [(2, 49, 256, 8, False), (3, 49, 256, 8, True), (2, 5, 16, 2, False), (4, 7, 24, 3, True),
                   (1, 1, 8, 1, True), (2, 20, 48, 1, False)]


@pytest.mark.parametrize("n, tokens, width, heads, masked", ATTENTION_CASES)
def test_attention_equals_the_definition(n, tokens, width, heads, masked):
    assert fused_ops.available()
    qkv, key_bias, dout = attention_case(n, tokens, width, heads, masked, tokens + width)
    got = run_attention(qkv, key_bias, dout, heads)
    want = numpy_attention(qkv, key_bias, dout, heads)[:len(got)]
    for got_one, want_one in zip(got, want):
        assert got_one.shape == want_one.shape
        np.testing.assert_allclose(got_one, want_one, rtol=1e-4, atol=1e-5 * max(np.abs(want_one).max(), 1e-3))


def test_attention_softmax_is_exact_to_float_over_the_range_of_scores():
    """Two keys, scores 0 and x (q = 0, x as key_bias), v = (0, 1): out = the second key's weight
    1 / (1 + exp(-x)), within a few float ulps of float64 for x in [-80, 80] (the operator's own
    vectorised exp), and exactly 0 for a left-out key (-1e9)."""
    assert fused_ops.available()
    x = np.concatenate([np.linspace(-80, 80, 40001), [-1e9, -200.0, -88.0]]).astype(np.float32)
    qkv = np.zeros((x.size, 2, 3), np.float32)
    qkv[:, 1, 2] = 1.0                                   # v of the second key
    key_bias = np.zeros((x.size, 1, 2), np.float32)
    key_bias[:, 0, 1] = x
    out = mx.nd.sample_fc_attention(mx.nd.array(qkv), mx.nd.array(key_bias), heads=1, key_bias=1).asnumpy()
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    np.testing.assert_allclose(out[:, 0, 0], want, rtol=1e-6, atol=1e-37)
    assert (out[-3:, :, 0] == 0).all()


def test_attention_equals_the_vit_composite_it_replaces():
    """symbols/vit.py's attention between its named ends (the qkv and proj linears around it),
    masked, against the same with the operator that fuse puts in: outputs and every gradient."""
    from sample_fc.symbols import vit
    data, key_bias = mx.sym.Variable("data"), mx.sym.Variable("key_bias")
    composite = vit.attention(data, "a", 64, 9, key_bias)
    fused = fused_ops.fuse(composite, (3, 9, 64))
    assert graph_ops(fused).count(fused_ops.ATTENTION_OP_NAME) == 1 and "batch_dot" not in graph_ops(fused)
    rng = np.random.default_rng(4)
    values = {"data": rng.standard_normal((3, 9, 64)), "a_qkv_weight": rng.standard_normal((192, 64)) * 0.2,
              "a_proj_weight": rng.standard_normal((64, 64)) * 0.1, "a_proj_bias": rng.standard_normal(64),
              "key_bias": np.where(rng.random((3, 1, 9)) < 0.3, -1e9, 0.0).repeat(vit.HEADS, axis=0)}
    head_grad = mx.nd.array(rng.standard_normal((3, 9, 64)))
    results = []
    for symbol in (composite, fused):
        args = {name: mx.nd.array(values[name]) for name in symbol.list_arguments()}
        grads = {name: mx.nd.zeros(args[name].shape) for name in args}
        executor = symbol.bind(mx.cpu(), args, args_grad=grads)
        executor.forward(is_train=True)
        executor.backward(head_grad)
        results.append([executor.outputs[0].asnumpy()] + [grads[name].asnumpy() for name in sorted(grads)])
    for got, want in zip(*reversed(results)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(np.abs(want).max(), 1e-3))


@pytest.mark.parametrize("qkv, key_bias, attrs, message", [
    ((2, 5, 30), None, dict(heads=4), "qkv must be \\(N, L, 3W\\) with W a multiple of heads = 4"),
    ((2, 5, 24), (2, 1, 5), dict(heads=2, key_bias=1), "key_bias must be \\(N heads, 1, L\\) = \\(4, 1, 5\\)"),
    ((2, 5, 24), None, dict(heads=0), "heads must be a positive integer, got '0'"),
    ((2, 5, 24), None, dict(heads=2, key_bias=2), "key_bias must be 0 or 1, got '2'")])
def test_attention_refuses_what_it_does_not_compute(qkv, key_bias, attrs, message):
    assert fused_ops.available()
    args = [mx.nd.ones(qkv)] + ([mx.nd.zeros(key_bias)] if key_bias else [])
    with pytest.raises(mx.MXNetError, match=message):
        mx.nd.sample_fc_attention(*args, **attrs).wait_to_read()


def test_fuse_replaces_each_vit_attention_and_leaves_one_read_from_outside():
    """vit_t's 12 attentions become the operator (its key_bias input for the masked vit_t, none
    for vit_t_dp005_mask0); an attention whose scores are also read outside it stays as it is."""
    for name, masked in (("vit_t", "1"), ("vit_t_dp005_mask0", "0")):
        nodes = json.loads(fused_ops.fuse(symbols.get_symbol(name, 16, 32), (2, 3, 32, 32)).tojson())["nodes"]
        fused = [node for node in nodes if node["op"] == fused_ops.ATTENTION_OP_NAME]
        assert len(fused) == 12 and {node["attrs"]["key_bias"] for node in fused} == {masked}
        assert {node["attrs"]["heads"] for node in fused} == {"8"}
        assert not {"batch_dot", "softmax", "SliceChannel"} & {node["op"] for node in nodes}
    from sample_fc.symbols import vit
    attention = vit.attention(mx.sym.Variable("data"), "a", 64, 9)
    scores = [output for output in attention.get_internals().list_outputs() if "softmax" in output]
    leaky = mx.sym.Group([attention, attention.get_internals()[scores[0]]])
    assert fused_ops.ATTENTION_OP_NAME not in graph_ops(fused_ops.fuse(leaky, (2, 9, 64)))


def test_attention_results_do_not_depend_on_the_thread_count(tmp_path):
    """Each (sample, head) task writes its own elements of every output."""
    one, two = results_at_one_and_two_threads(tmp_path, (32, 49, 768), (32 * 8, 1, 49),
                                              "np.where(rng.random(32 * 8 * 49) < 0.2, -1e9, 0.0)",
                                              "mx.nd.sample_fc_attention(x, p, heads=8, key_bias=1)")
    for name in ("y", "dx", "dp"):
        assert np.array_equal(one[name], two[name]), name


def run_clip(symbol, x, dy):
    """y and dx of a one-input symbol through MXNet's executor."""
    grad = mx.nd.zeros(x.shape)
    executor = symbol.bind(mx.cpu(), {"x": mx.nd.array(x)}, args_grad={"x": grad})
    executor.forward(is_train=True)
    executor.backward(mx.nd.array(dy))
    return executor.outputs[0].asnumpy(), grad.asnumpy()


@pytest.mark.parametrize("shape, a_min, a_max", [((7,), 0.0, 6.0), ((3, 5, 4), -1.0, 0.5),
                                                 ((2, 49, 1024), 0.0, 6.0),          # OpenMP, a ViT MLP's
                                                 ((40000,), -float("inf"), 0.0), ((9, 3), 2.0, 2.0)])
def test_clip_equals_the_definition_and_mxnet_clip_bit_for_bit(shape, a_min, a_max):
    """y = min(max(x, a_min), a_max); dx = dy where a_min <= x <= a_max (the bounds themselves
    included, as MXNet's clip), NaN through the forward and its gradient through the backward."""
    assert fused_ops.available()
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = x.reshape(-1)
    flat[::11] = a_min
    flat[5::13] = a_max
    flat[3::17] = np.nan
    dy = rng.standard_normal(shape).astype(np.float32)
    with np.errstate(invalid="ignore"):
        want_y = np.where(np.isnan(x), x, np.minimum(np.maximum(x, a_min), a_max))
        want_dx = np.where((x > a_max) | (x < a_min), 0.0, dy).astype(np.float32)
    data = mx.sym.Variable("x")
    ours = run_clip(mx.sym.sample_fc_clip(data, a_min=a_min, a_max=a_max), x, dy)
    theirs = run_clip(mx.sym.clip(data, a_min, a_max), x, dy)
    for got, want, mxnet in zip(ours, (want_y, want_dx), theirs):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, mxnet)


@pytest.mark.parametrize("attrs, message", [({"a_min": "0"}, "needs the attribute a_max"),
                                            ({"a_min": "x", "a_max": "1"}, "a_min must be a number, got 'x'"),
                                            ({"a_min": "2", "a_max": "1"}, "a_min must be <= a_max")])
def test_clip_refuses_what_it_does_not_compute(attrs, message):
    assert fused_ops.available()
    with pytest.raises(mx.MXNetError, match=message):
        mx.nd.sample_fc_clip(mx.nd.ones((2, 8)), **attrs).wait_to_read()


def test_fuse_replaces_each_clip_outside_a_prelu():
    """A ViT's 12 ReLU6s become the operator with their names and bounds; mbf's clips are its
    PReLUs' (the PReLU operator takes them)."""
    fused = fused_ops.fuse(symbols.get_symbol("vit_t_dp005_mask0", 16, 32), (2, 3, 32, 32))
    nodes = json.loads(fused.tojson())["nodes"]
    clips = [node for node in nodes if node["op"] == fused_ops.CLIP_OP_NAME]
    assert len(clips) == 12 and "clip" not in graph_ops(fused)
    assert {(node["attrs"]["a_min"], node["attrs"]["a_max"]) for node in clips} == {("0.0", "6.0")}
    assert fused_ops.CLIP_OP_NAME not in graph_ops(fused_ops.fuse(symbols.get_symbol("mbf", 16, 32), (2, 3, 32, 32)))


def graph_ops(symbol):
    return [node["op"] for node in json.loads(symbol.tojson())["nodes"]]


@pytest.mark.parametrize("network,prelus,convs", [("mbf_small", 33, []), ("mbf", 33, ["stem_dw_conv"]),
                                                   ("r18", 9, [])])
def test_fuse_replaces_each_prelu_and_keeps_the_parameters(network, prelus, convs):
    """mbf's stem_dw_conv (2 channels per group) is the one grouped conv replaced: mbf_small's
    (1 per group: depthwise) and the blocks' depthwise convs stay MXNet's."""
    composite = symbols.get_symbol(network, 32, 32)
    fused = fused_ops.fuse(composite, (4, 3, 32, 32))
    ops = graph_ops(fused)
    assert ops.count(fused_ops.OP_NAME) == prelus
    nodes = json.loads(fused.tojson())["nodes"]
    assert [node["name"] for node in nodes if node["op"] == fused_ops.CONV_OP_NAME] == convs
    assert ops.count("Convolution") == graph_ops(composite).count("Convolution") - prelus - len(convs)
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


def test_fuse_leaves_a_grouped_conv_whose_input_channels_it_cannot_know():
    """Without the data shape the stem conv's input channels are unknown: it stays MXNet's."""
    fused = fused_ops.fuse(symbols.get_symbol("mbf", 16, 32))
    assert fused_ops.CONV_OP_NAME not in graph_ops(fused)
    assert graph_ops(fused).count(fused_ops.OP_NAME) == 33


def test_fuse_replaces_only_the_convs_the_operator_computes():
    data = mx.sym.Variable("data")
    same = dict(kernel=(3, 3), pad=(1, 1), no_bias=True)
    layers = {"two": dict(num_filter=16, num_group=8, **same),                 # replaced
              "four": dict(num_filter=16, num_group=4, **same),                # replaced
              "depthwise": dict(num_filter=16, num_group=16, **same),
              "eight": dict(num_filter=16, num_group=2, **same),
              "strided": dict(num_filter=16, num_group=8, stride=(2, 2), **same),
              "dilated": dict(num_filter=16, num_group=8, kernel=(3, 3), pad=(2, 2), dilate=(2, 2), no_bias=True),
              "biased": dict(num_filter=16, num_group=8, kernel=(3, 3), pad=(1, 1)),
              "unpadded": dict(num_filter=16, num_group=8, kernel=(3, 3), no_bias=True),
              "wider": dict(num_filter=32, num_group=8, **same)}                # 2 in, 4 out per group
    outputs = [mx.sym.Convolution(data, name=name, **attrs) for name, attrs in layers.items()]
    nodes = json.loads(fused_ops.fuse(mx.sym.Group(outputs), (2, 16, 8, 8)).tojson())["nodes"]
    replaced = {node["name"]: node["attrs"] for node in nodes if node["op"] == fused_ops.CONV_OP_NAME}
    assert replaced == {"two": {"num_group": "8"}, "four": {"num_group": "4"}}


@pytest.mark.parametrize("network,tolerance", [("mbf_small", 1e-5), ("mbf", 5e-5), ("r18", 1e-5),
                                               ("vit_t_dp005_mask0", 1e-3)])
def test_a_fused_network_trains_as_the_composite_one(network, tolerance):
    """The same outputs and gradients up to float rounding: the PReLU operator's own values are
    the composite's bits (test above), but oneDNN may choose another kernel for the next layer
    when its input no longer comes from a convolution (measured: r18 differs by ~1e-6, mbf_small
    not). mbf's grouped conv sums in another order, and this random network amplifies rounding:
    measured ~1e-5 (out) and ~2e-5 (gradients) relative, as much as the composite itself moves
    when stem_dw_conv's weights are perturbed by 3e-8 relative (less than an ulp). The ViT's
    LayerNorms: out ~1e-6; its gradients 3.7e-4 relative as a whole (block5's fc1 and norm2, at
    ReLU6's kinks), exactly what the composite itself moves when its norms' gammas move by one ulp
    (3.7e-4 too, measured)."""
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
    mx.random.seed(5)          # the ViT's drop path: the same draws in both runs
    out_c, grads_c = forward_backward(composite, arg_params, aux_params, data, head_grad)
    fused = fused_ops.fuse(composite, data.shape)
    mx.random.seed(5)
    assert graph_ops(fused).count(fused_ops.CONV_OP_NAME) == (network == "mbf")
    out_f, grads_f = forward_backward(fused, arg_params, aux_params, data, head_grad)
    np.testing.assert_allclose(out_f, out_c, rtol=0, atol=tolerance * np.abs(out_c).max())
    everything_c = np.concatenate([g.ravel() for g in grads_c.values()])
    everything_f = np.concatenate([grads_f[name].ravel() for name in grads_c])
    assert np.linalg.norm(everything_f - everything_c) <= tolerance * np.linalg.norm(everything_c)
    scale = np.abs(everything_c).max()     # per parameter, against the largest gradient: some
    for name in grads_c:                   # (BN betas near the output) are sums that nearly cancel
        assert np.abs(grads_c[name] - grads_f[name]).max() <= max(1e-4, tolerance) * scale, name


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


def results_at_one_and_two_threads(tmp_path, data_shape, param_shape, param_values, op_call):
    """Run `op_call` (code, of x and p) forward and backward in a fresh process at
    OMP_NUM_THREADS 1 and 2, on the same random x (data_shape) and head gradient and p
    (param_shape, `param_values` code); returns both runs' {y, dx, dp}."""
    code = ("import sys, numpy as np, mxnet as mx\n"
            "from sample_fc import fused_ops\n"
            "assert fused_ops.available()\n"
            "rng = np.random.default_rng(0)\n"
            f"x = mx.nd.array(rng.standard_normal({data_shape!r}).astype(np.float32))\n"
            f"p = mx.nd.array(({param_values}).reshape({param_shape!r}).astype(np.float32))\n"
            "x.attach_grad(); p.attach_grad()\n"
            "with mx.autograd.record():\n"
            f"    y = {op_call}\n"
            f"y.backward(mx.nd.array(rng.standard_normal({data_shape!r}).astype(np.float32)))\n"
            "np.savez(OUT, y=y.asnumpy(), dx=x.grad.asnumpy(), dp=p.grad.asnumpy())\n")
    runs = []
    for threads in ("1", "2"):
        out = tmp_path / f"threads{threads}.npz"
        run_python(f"OUT = {str(out)!r}\n" + code, {"OMP_NUM_THREADS": threads})
        with np.load(out) as arrays:
            runs.append(dict(arrays))
    return runs


def test_slope_gradients_do_not_depend_on_the_thread_count(tmp_path):
    one, two = results_at_one_and_two_threads(tmp_path, (32, 24, 16, 16), (24, 1, 1, 1), "np.full(24, 0.25)",
                                              "mx.nd.sample_fc_prelu(x, p)")
    assert np.array_equal(one["dp"], two["dp"])


def test_group_conv_results_do_not_depend_on_the_thread_count(tmp_path):
    """dW: each thread sums whole groups over the batch in order; y and dx: whole planes."""
    one, two = results_at_one_and_two_threads(tmp_path, (32, 128, 16, 16), (128, 2, 3, 3),
                                              "rng.standard_normal(128 * 2 * 9)",
                                              "mx.nd.sample_fc_group_conv3x3(x, p, num_group=64)")
    for name in ("y", "dx", "dp"):
        assert np.array_equal(one[name], two[name]), name


def test_a_float16_backbone_is_left_to_mxnet_and_binds():
    """Test that fuse leaves a float16 network (its parameters float16; our operators are float32
    only) unchanged, so that it binds on the CPU (e.g. a GPU-trained fp16 model embedded on a
    CPU), while the float32 one of the same network is fused."""
    assert fused_ops.available()
    half = symbols.get_symbol("mbf", 128, 32, dtype="float16")
    assert fused_ops.fuse(half, (2, 3, 32, 32)) is half
    module = mx.mod.Module(fused_ops.fuse(half, (2, 3, 32, 32)), data_names=("data",), label_names=None)
    module.bind(data_shapes=[("data", (2, 3, 32, 32))], for_training=False)
    single = symbols.get_symbol("mbf", 128, 32)
    assert fused_ops.fuse(single, (2, 3, 32, 32)) is not single


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
