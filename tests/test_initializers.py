"""Tests of sample_fc.initializers: the backbone's initial parameters by kind."""
import mxnet as mx
import numpy as np
import pytest

import symbols
from sample_fc.initializers import backbone_initializer


def _initialised(kind, seed=0):
    mx.random.seed(seed)
    module = mx.mod.Module(symbols.get_symbol("mbf_small", 64, 32, "float32", 0.0), data_names=("data",),
                           label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", (2, 3, 32, 32))], for_training=True)
    module.init_params(initializer=backbone_initializer(kind))
    arg, aux = module.get_params()
    return {k: v.asnumpy() for k, v in arg.items()}, {k: v.asnumpy() for k, v in aux.items()}


def test_pytorch_init_is_uniform_within_one_over_sqrt_fan_in():
    """Test that with "pytorch" every conv/FC weight lies in +-1/sqrt(fan_in) (fan_in = input
    channels per group x kernel area, computed here from the shape) and fills it (std close to
    bound/sqrt(3), the uniform's), and that BN, PReLU and moving statistics start at the fixed
    values (gamma 1, beta 0, slope 0.25, mean 0, var 1)."""
    arg, aux = _initialised("pytorch")
    weights = [n for n in arg if n.endswith("_weight") and "prelu" not in n]
    assert len(weights) > 40
    for name in weights:
        w = arg[name]
        bound = 1.0 / np.sqrt(np.prod(w.shape[1:]))
        assert np.abs(w).max() <= bound * (1 + 1e-6), name
        if w.size >= 500:
            assert abs(w.std() / (bound / np.sqrt(3)) - 1) < 0.1, (name, w.std(), bound)
    for name, value in arg.items():
        if name.endswith("_beta"):
            assert not value.any(), name
        elif name.endswith("_prelu_gamma"):
            np.testing.assert_array_equal(value, 0.25)
        elif name.endswith("_gamma"):
            np.testing.assert_array_equal(value, 1.0)
    for name, value in aux.items():
        np.testing.assert_array_equal(value, 0.0 if name.endswith("moving_mean") else 1.0)


def test_xavier_init_is_mxnets_magnitude_2_and_smaller_on_depthwise_convs():
    """Test that "xavier" gives MXNet's Xavier(magnitude=2) bound sqrt(4 / (fan_in + fan_out))
    with fan_out = output channels x kernel area, so a depthwise conv (fan_in 9) starts far
    smaller than under "pytorch" (bound 1/3)."""
    arg, _ = _initialised("xavier")
    w = arg["stem_dw_conv_weight"]                       # (64, 1, 3, 3): fan_in 9, fan_out 576
    bound = np.sqrt(4.0 / (9 + 64 * 9))
    assert np.abs(w).max() <= bound * (1 + 1e-6)
    assert np.abs(w).max() > 0.9 * bound
    assert np.abs(_initialised("pytorch")[0]["stem_dw_conv_weight"]).max() > 3 * bound


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match=r"backbone_init must be one of \('pytorch', 'xavier'\), got 'he'"):
        backbone_initializer("he")
