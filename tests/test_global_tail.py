"""pfc/global_tail.py: where a backbone is split for tail_bn=global, and that body then tail is
the whole network, forward and backward, against the unsplit MXNet graph."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
from sample_fc.errors import UsageError
from sample_fc.pfc.global_tail import GlobalTail, split_tail

BATCH, SIDE = 8, 32


@pytest.mark.parametrize("network, dtype, cut_shape, cut_dtype, tail_params", [
    ("mbf", "float32", (512, 1, 1), "float32", ["gdc_bn_gamma", "gdc_bn_beta", "embedding_fc_weight",
                                                 "embeddings_gamma", "embeddings_beta"]),
    ("mbf_small", "float16", (512, 1, 1), "float16", ["gdc_bn_gamma", "gdc_bn_beta", "embedding_fc_weight",
                                                       "embeddings_gamma", "embeddings_beta"]),
    ("r18", "float16", (64,), "float32", ["embeddings_gamma", "embeddings_beta"])])
def test_the_cut_is_the_first_batchnorm_over_samples_only(network, dtype, cut_shape, cut_dtype, tail_params):
    """Test that mbf is cut at its GDC's output (1 x 1 maps: the GDC BatchNorm, the embedding layer
    and its BatchNorm go to the tail) and an IResNet at its embedding layer's output (only the
    embedding BatchNorm; its spatial bn2 stays in the body), with the cut's type."""
    body, tail, shape, kind = split_tail(symbols.get_symbol(network, 64, SIDE, dtype), (BATCH, 3, SIDE, SIDE))
    assert shape == cut_shape and kind == cut_dtype
    assert tail.list_arguments() == ["tail_data"] + tail_params
    assert not set(tail_params) & set(body.list_arguments())


def test_dropout_in_the_tail_or_no_such_batchnorm_is_one_line():
    """Test that a tail that would drop out (each worker its own mask) and a network without a
    BatchNorm over samples are refused with a UsageError naming the fix."""
    with pytest.raises(UsageError, match="features_dropout drops out at p=0.3.*set dropout=0 or tail_bn=worker"):
        split_tail(symbols.get_symbol("mbf", 64, SIDE, dropout=0.3), (BATCH, 3, SIDE, SIDE))
    split_tail(symbols.get_symbol("r18", 64, SIDE, dropout=0.3), (BATCH, 3, SIDE, SIDE))   # before the cut: fine
    plain = mx.sym.FullyConnected(mx.sym.Flatten(mx.sym.var("data")), num_hidden=4, name="fc")
    with pytest.raises(UsageError, match="no BatchNorm over samples only"):
        split_tail(plain, (BATCH, 3, 4, 4))


@pytest.mark.parametrize("network", ["mbf_small", "r18"])
def test_body_then_tail_is_the_whole_network_in_training(network):
    """Test that the body's output, flattened, through GlobalTail gives the unsplit network's
    training-mode embeddings, moving statistics and, from the same output gradient, every
    parameter's gradient (relative to the gradients' global norm: BatchNorm betas followed by
    another BatchNorm have a gradient that is rounding alone)."""
    symbol = symbols.get_symbol(network, 64, SIDE)
    shape = (BATCH, 3, SIDE, SIDE)
    whole = mx.mod.Module(symbol, data_names=("data",), label_names=None)
    whole.bind([("data", shape)], for_training=True)
    mx.random.seed(1)
    whole.init_params(mx.init.Xavier())
    arg_params, aux_params = whole.get_params()
    body_symbol, tail_symbol, cut_shape, cut_dtype = split_tail(symbol, shape)
    body = mx.mod.Module(body_symbol, data_names=("data",), label_names=None)
    body.bind([("data", shape)], for_training=True)
    body.init_params(arg_params=arg_params, aux_params=aux_params, allow_extra=True)
    tail = GlobalTail(tail_symbol, cut_shape, BATCH, mx.cpu(), cut_dtype)
    tail.module.init_params(arg_params=arg_params, aux_params=aux_params, allow_extra=True)
    rng = np.random.default_rng(0)
    batch = mx.io.DataBatch([mx.nd.array(rng.uniform(0, 255, shape))])
    out_grad = mx.nd.array(rng.standard_normal((BATCH, 64)))
    whole.forward(batch, is_train=True)
    whole.backward([out_grad])
    body.forward(batch, is_train=True)
    features = body.get_outputs()[0]
    embeddings = tail.forward(mx.nd.reshape(features, (BATCH, -1)))
    body.backward([mx.nd.reshape(tail.backward(out_grad), features.shape)])
    np.testing.assert_allclose(embeddings.asnumpy(), whole.get_outputs()[0].asnumpy(), rtol=1e-4, atol=1e-5)
    expected = dict(zip(whole._exec_group.param_names, (g[0].asnumpy() for g in whole._exec_group.grad_arrays)))
    split = dict(zip(body._exec_group.param_names, (g[0].asnumpy() for g in body._exec_group.grad_arrays)))
    split.update(zip(tail.param_names, (g[0].asnumpy() for g in tail.grad_arrays)))
    assert sorted(split) == sorted(expected)
    total = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in expected.values()))
    for name, grad in expected.items():
        assert np.linalg.norm(split[name] - grad) <= 1e-5 * total, name
    moving = dict(zip(whole._exec_group.aux_names, whole._exec_group.aux_arrays))
    for name, value in zip(tail.module._exec_group.aux_names, tail.aux_arrays):
        np.testing.assert_allclose(value[0].asnumpy(), moving[name][0].asnumpy(), rtol=1e-4, atol=1e-6, err_msg=name)
