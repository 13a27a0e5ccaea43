"""Tests for symbols/: shapes, a CPU forward/backward, parameter counts, argument checks."""
import mxnet as mx
import numpy as np
import pytest

import symbols
from symbols import NETWORKS, get_symbol


def count_params(sym, image_size):
    """Number of learnable values (arguments except `data`; BN moving stats are aux)."""
    arg_shapes, _, _ = sym.infer_shape(data=(1, 3, image_size, image_size))
    return sum(int(np.prod(shape)) for name, shape in zip(sym.list_arguments(), arg_shapes)
               if name != 'data')


# ---- parameter counts worked out by hand from the architecture description ----

def bn(c):
    return 2 * c                      # gamma + beta (moving mean/var are not parameters)


def iresnet_params(units, embedding_size, image_size):
    """IResNet: stem conv3x3 3->64 + BN + PReLU; per unit BN, conv3x3, BN, PReLU,
    conv3x3, BN (+ conv1x1 + BN shortcut in the first, strided unit of each stage);
    head BN(512), FC(512*s*s -> D, with bias), BN(D)."""
    total = 3 * 64 * 9 + bn(64) + 64
    c_in = 64
    for c, n in zip((64, 128, 256, 512), units):
        for i in range(n):
            total += bn(c_in) + c_in * c * 9 + bn(c) + c + c * c * 9 + bn(c)
            if i == 0:
                total += c_in * c + bn(c)
            c_in = c
    side = image_size // 16
    return total + bn(512) + 512 * side * side * embedding_size + embedding_size \
        + bn(embedding_size)


def mobilefacenet_params(embedding_size, image_size):
    """MobileFaceNet (paper Table 1 with blocks 1, 4, 6, 2): every conv is bias-free and
    followed by BN, and by a PReLU (one slope per channel) unless it is linear."""
    def conv(c_in, c_out, k, groups=1, act=True):
        return c_in // groups * c_out * k * k + bn(c_out) + (c_out if act else 0)

    def block(c_in, width, c_out):   # expand 1x1, depthwise 3x3, linear project 1x1
        return conv(c_in, width, 1) + conv(width, width, 3, groups=width) \
            + conv(width, c_out, 1, act=False)

    side = image_size // 16
    total = conv(3, 64, 3) + conv(64, 64, 3, groups=64)
    total += block(64, 128, 64) + 4 * block(64, 128, 64)
    total += block(64, 256, 128) + 6 * block(128, 256, 128)
    total += block(128, 512, 128) + 2 * block(128, 256, 128)
    total += conv(128, 512, 1) + conv(512, 512, side, groups=512, act=False)
    return total + 512 * embedding_size + bn(embedding_size)   # FC without bias, BN


@pytest.mark.parametrize('name', NETWORKS)
def test_output_shape_112(name):
    """Test that every network maps (N, 3, 112, 112) to embeddings (N, D)."""
    sym = get_symbol(name, embedding_size=256, image_size=112)
    assert sym.list_outputs() == ['embeddings_output']
    assert sym.list_arguments()[0] == 'data'
    _, out_shapes, _ = sym.infer_shape(data=(4, 3, 112, 112))
    assert out_shapes == [(4, 256)]


@pytest.mark.parametrize('name', ['r18', 'mbf'])
def test_output_shape_64(name):
    """Test that r18 and mbf also build for 64x64 inputs (a 4x4 final map)."""
    sym = get_symbol(name, image_size=64)
    _, out_shapes, _ = sym.infer_shape(data=(3, 3, 64, 64))
    assert out_shapes == [(3, 512)]


@pytest.mark.parametrize('name', ['r50', 'mbf'])
def test_forward_backward_cpu(name):
    """Test that r50 and mbf run forward and backward on CPU with finite, non-zero
    gradients down to the first conv."""
    sym = get_symbol(name, image_size=112)
    exe = sym.simple_bind(ctx=mx.cpu(), data=(2, 3, 112, 112), grad_req='write')
    rng = np.random.RandomState(0)
    for arg_name, arr in exe.arg_dict.items():
        if arg_name == 'data':
            arr[:] = rng.normal(size=arr.shape)
        elif arg_name.endswith('_weight'):
            arr[:] = rng.normal(0, 0.05, arr.shape)
        elif arg_name.endswith('_prelu_gamma'):
            arr[:] = 0.25
        elif arg_name.endswith('_gamma'):
            arr[:] = 1.0
        else:
            arr[:] = 0.0
    out = exe.forward(is_train=True)[0].asnumpy()
    assert out.shape == (2, 512) and np.isfinite(out).all()

    # Random out_grad, not ones: the last layer is a training-mode BatchNorm, whose
    # outputs sum to zero over the batch, so d(sum of outputs)/d(input) is exactly 0.
    exe.backward([mx.nd.array(rng.normal(size=out.shape))])
    grad = exe.grad_dict['stem_conv_weight'].asnumpy()
    assert np.isfinite(grad).all()
    assert np.abs(grad).max() > 1e-6


@pytest.mark.parametrize('name,units', [('r18', (2, 2, 2, 2)), ('r34', (3, 4, 6, 3)),
                                        ('r50', (3, 4, 14, 3)), ('r100', (3, 13, 30, 3))])
@pytest.mark.parametrize('embedding_size,image_size', [(512, 112), (128, 64)])
def test_iresnet_param_count(name, units, embedding_size, image_size):
    """Test that the IResNet parameter counts equal the hand-derived formula."""
    sym = get_symbol(name, embedding_size=embedding_size, image_size=image_size)
    assert count_params(sym, image_size) == iresnet_params(units, embedding_size, image_size)


@pytest.mark.parametrize('embedding_size,image_size', [(512, 112), (128, 112), (512, 64)])
def test_mobilefacenet_param_count(embedding_size, image_size):
    """Test that the MobileFaceNet parameter count equals the hand-derived formula."""
    sym = get_symbol('mbf', embedding_size=embedding_size, image_size=image_size)
    assert count_params(sym, image_size) == mobilefacenet_params(embedding_size, image_size)


@pytest.mark.parametrize('name,embedding_size,published', [
    # insightface's arcface_torch ONNX exports (512-d, fp32) as listed in PaddlePaddle
    # FastDeploy's examples/vision/faceid/insightface/README.md: r18 92MB, r34 131MB,
    # r50 167MB, r100 249MB; MiB / 4 bytes -> 24.1M, 34.3M, 43.8M, 65.3M values (the
    # files also hold the BN moving statistics). The insightface model zoo quotes
    # r50 43.6M and r100 65.2M.
    ('r18', 512, 92 * 2 ** 20 / 4), ('r34', 512, 131 * 2 ** 20 / 4),
    ('r50', 512, 43.6e6), ('r100', 512, 65.2e6),
    # MobileFaceNet paper (arXiv 1804.07573): 0.99M parameters with a 128-d output.
    ('mbf', 128, 0.99e6),
])
def test_param_count_matches_published(name, embedding_size, published):
    """Test that parameter counts agree with published figures within 2%."""
    count = count_params(get_symbol(name, embedding_size=embedding_size), 112)
    assert abs(count - published) / published < 0.02, (name, count, published)


def test_unknown_name_raises():
    """Test that an unknown network name raises ValueError naming it and the choices."""
    with pytest.raises(ValueError) as err:
        get_symbol('r200')
    assert "'r200'" in str(err.value)
    for valid in NETWORKS:
        assert valid in str(err.value)


@pytest.mark.parametrize('name', ['r18', 'mbf'])
@pytest.mark.parametrize('image_size', [100, 0, -16, 112.0, '112'])
def test_bad_image_size_raises(name, image_size):
    """Test that an image size that is not a positive multiple of 16 raises ValueError."""
    with pytest.raises(ValueError) as err:
        get_symbol(name, image_size=image_size)
    assert repr(image_size) in str(err.value)
    assert 'multiple of 16' in str(err.value)


@pytest.mark.parametrize('name', ['r18', 'mbf'])
def test_bad_dtype_raises(name):
    """Test that an unknown dtype raises ValueError naming it and the valid dtypes."""
    with pytest.raises(ValueError) as err:
        get_symbol(name, dtype='bfloat16')
    message = str(err.value)
    assert "'bfloat16'" in message and 'float32' in message and 'float16' in message


@pytest.mark.parametrize('kwargs,bad', [({'dropout': 1.0}, '1.0'),
                                        ({'dropout': -0.1}, '-0.1'),
                                        ({'embedding_size': 0}, '0')])
def test_bad_dropout_or_embedding_size_raises(kwargs, bad):
    """Test that dropout outside [0, 1) or a non-positive embedding size raises ValueError."""
    with pytest.raises(ValueError, match='got ' + bad):
        get_symbol('r18', **kwargs)


@pytest.mark.parametrize('name', ['r18', 'mbf'])
def test_float16_types(name):
    """Test that a float16 backbone infers shapes, runs its convs in fp16 and outputs fp32."""
    sym = get_symbol(name, dtype='float16')
    _, out_shapes, _ = sym.infer_shape(data=(2, 3, 112, 112))
    assert out_shapes == [(2, 512)]
    arg_types, out_types, _ = sym.infer_type(data=np.float32)
    types = dict(zip(sym.list_arguments(), arg_types))
    assert out_types == [np.float32]
    assert types['data'] == np.float32
    assert types['stem_conv_weight'] == np.float16
    assert types['embedding_fc_weight'] == np.float32


def test_dropout_in_graph():
    """Test that the dropout probability reaches the Dropout layer before the FC."""
    for name in ('r18', 'mbf'):
        graph = get_symbol(name, dropout=0.4).tojson()
        assert '"op": "Dropout"' in graph and '"p": "0.4"' in graph


def test_public_names():
    """Test that the package exports get_symbol and NETWORKS as a tuple."""
    assert symbols.NETWORKS == ('r18', 'r34', 'r50', 'r100', 'mbf')
    assert set(symbols.__all__) == {'NETWORKS', 'get_symbol'}


def test_prelu_matches_numpy_formula():
    """Test that the PReLU helper computes max(x, 0) + slope_c * min(x, 0) per channel, with
    slopes initialised to 0.25, and that its slope gradient matches the NumPy formula."""
    from symbols.common import prelu
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4, 5))
    slopes = np.array([0.25, -0.5, 2.0])
    sym = prelu(mx.sym.Variable('data'), 'act', 3)
    exe = sym.simple_bind(ctx=mx.cpu(), data=x.shape, grad_req='write')
    exe.arg_dict['data'][:] = x
    exe.arg_dict['act_gamma'][:] = slopes.reshape(3, 1, 1, 1)
    out = exe.forward(is_train=True)[0].asnumpy()
    want = np.maximum(x, 0) + slopes.reshape(1, 3, 1, 1) * np.minimum(x, 0)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    exe.backward([mx.nd.ones(x.shape)])
    np.testing.assert_allclose(exe.grad_dict['act_gamma'].asnumpy().ravel(),
                               np.minimum(x, 0).sum(axis=(0, 2, 3)), rtol=1e-5)
    init = mx.init.Xavier()
    gamma = mx.nd.zeros((3, 1, 1, 1))
    init(mx.init.InitDesc('act_gamma', attrs=sym.attr_dict()['act_gamma']), gamma)
    np.testing.assert_array_equal(gamma.asnumpy(), 0.25)
