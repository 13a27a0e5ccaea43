"""Tests of sample_fc.initializers: the backbone's initial parameters by kind."""
import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
from sample_fc.initializers import backbone_initializer


def _initialised(kind, seed=0, network="mbf_small"):
    mx.random.seed(seed)
    module = mx.mod.Module(symbols.get_symbol(network, 64, 32, "float32", 0.0), data_names=("data",),
                           label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", (2, 3, 32, 32))], for_training=True)
    module.init_params(initializer=backbone_initializer(kind, network))
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


def _std_ratio(w, std):
    return abs(w.std() / std - 1)


@pytest.mark.parametrize("network", ["mbf_small", "mbf"])
def test_arcface_torch_init_on_mobilefacenet_is_normal_over_fan_out(network):
    """Test that "arcface_torch" on a MobileFaceNet gives every conv and the embedding FC weight
    mean 0 and std sqrt(2 / fan_out), fan_out = output channels x kernel area computed here from
    the shape (kaiming_normal_, fan_out, relu, as arcface_torch's mobilefacenet.py), so a
    depthwise conv of C channels starts with a std sqrt(C / 6) times smaller than under
    "pytorch" (std 1/sqrt(27); sqrt(C / 12) with 2 inputs per group); BN and PReLU as ever."""
    arg, aux = _initialised("arcface_torch", network=network)
    weights = [n for n in arg if n.endswith("_weight") and "prelu" not in n]
    assert "embedding_fc_weight" in weights and len(weights) > 40
    for name in weights:
        w = arg[name]
        std = np.sqrt(2.0 / (w.shape[0] * np.prod(w.shape[2:])))
        if w.size >= 2000:
            assert _std_ratio(w, std) < 0.1 and abs(w.mean()) < 0.1 * std, (name, w.std(), std)
    w = arg["stem_dw_conv_weight"]      # (C, g, 3, 3): grouped, g = 1 (mbf_small) or 2 (mbf) inputs per group
    channels, per_group = w.shape[:2]
    assert _std_ratio(w, np.sqrt(2 / (9 * channels))) < 0.1
    pytorch = _initialised("pytorch", network=network)[0]["stem_dw_conv_weight"]
    assert _std_ratio(pytorch, 1 / np.sqrt(27 * per_group)) < 0.1
    assert abs(pytorch.std() / w.std() / np.sqrt(channels / (6 * per_group)) - 1) < 0.15
    assert all(np.all(v == 0.25) for n, v in arg.items() if n.endswith("_prelu_gamma"))
    assert all(np.all(v == 1.0) for n, v in aux.items() if n.endswith("moving_var"))


def test_arcface_torch_init_on_iresnet_is_normal_0_1_convs_and_a_uniform_fc():
    """Test that "arcface_torch" on an IResNet gives every conv weight std 0.1 (iresnet.py's
    normal_(0, 0.1)) and the embedding FC PyTorch's default U(+-1/sqrt(fan_in))."""
    arg, _ = _initialised("arcface_torch", network="r18")
    convs = [n for n in arg if n.endswith("_weight") and arg[n].ndim == 4]
    assert len(convs) > 15
    for name in convs:
        if arg[name].size >= 1000:
            assert _std_ratio(arg[name], 0.1) < 0.1, (name, arg[name].std())
    fc = arg["embedding_fc_weight"]
    bound = 1 / np.sqrt(fc.shape[1])
    assert np.abs(fc).max() <= bound * (1 + 1e-6) and _std_ratio(fc, bound / np.sqrt(3)) < 0.1


def test_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match=r"backbone_init must be one of \('arcface_torch', 'pytorch', 'xavier'\), "
                                         r"got 'he'"):
        backbone_initializer("he")
