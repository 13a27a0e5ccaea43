"""Tests for symbols/: shapes, a CPU forward/backward, parameter counts, argument checks."""
import hashlib

import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
from sample_fc.symbols import NETWORKS, get_symbol
from sample_fc.symbols.mobilefacenet import get_mobilefacenet
from sample_fc import initializers
from sample_fc.models import torch_backbone


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


# ---- parameter counts of insightface's arcface_torch networks, summed by hand from the
# modules of recognition/arcface_torch/backbones/{iresnet,mobilefacenet}.py: what
# sum(p.numel() for p in model.parameters()) gives, BN weight and bias included (also the
# frozen weight of IResNet's `features` BatchNorm1d); running statistics are buffers ----

def torch_conv2d(c_in, c_out, k, groups=1):
    return c_in // groups * c_out * k * k          # every Conv2d has bias=False


def torch_conv_block(c_in, c_out, k, groups=1):    # Conv2d, BatchNorm2d, PReLU(c_out)
    return torch_conv2d(c_in, c_out, k, groups) + 2 * c_out + c_out


def torch_linear_block(c_in, c_out, k, groups=1):  # Conv2d, BatchNorm2d
    return torch_conv2d(c_in, c_out, k, groups) + 2 * c_out


def torch_depth_wise(c_in, c_out, groups):
    """DepthWise(in_c, out_c, groups): ConvBlock 1x1 to `groups` channels, ConvBlock 3x3
    with `groups` groups, LinearBlock 1x1 to out_c."""
    return torch_conv_block(c_in, groups, 1) + torch_conv_block(groups, groups, 3, groups) \
        + torch_linear_block(groups, c_out, 1)


def arcface_torch_mbf_params(blocks, scale, num_features=512):
    """MobileFaceNet(blocks, scale) at 112 px: ConvBlock 3->64s s2; ConvBlock 64s->64s with
    groups=64 if blocks[0] == 1, else Residual(64s, blocks[0], groups=128); DepthWise(64s,
    64s, 128), Residual(64s, blocks[1], 128); DepthWise(64s, 128s, 256), Residual(128s,
    blocks[2], 256); DepthWise(128s, 128s, 512), Residual(128s, blocks[3], 256); conv_sep
    ConvBlock 128s->512; GDC: LinearBlock 512, 7x7, groups 512 -> Linear(512, D, no bias)
    -> BatchNorm1d(D)."""
    c64, c128 = 64 * scale, 128 * scale
    total = torch_conv_block(3, c64, 3)
    if blocks[0] == 1:
        total += torch_conv_block(c64, c64, 3, groups=64)
    else:
        total += blocks[0] * torch_depth_wise(c64, c64, 128)
    total += torch_depth_wise(c64, c64, 128) + blocks[1] * torch_depth_wise(c64, c64, 128)
    total += torch_depth_wise(c64, c128, 256) + blocks[2] * torch_depth_wise(c128, c128, 256)
    total += torch_depth_wise(c128, c128, 512) + blocks[3] * torch_depth_wise(c128, c128, 256)
    total += torch_conv_block(c128, 512, 1)
    return total + torch_linear_block(512, 512, 7, groups=512) + 512 * num_features \
        + 2 * num_features


def arcface_torch_iresnet_params(layers, num_features=512):
    """IResNet(IBasicBlock, layers) at 112 px: conv1 3->64 + bn1 + prelu; per IBasicBlock
    bn1(inplanes), conv3x3, bn2, prelu, conv3x3, bn3, and in the first (stride 2) block of
    each layer a downsample conv1x1 + BatchNorm2d; bn2(512), fc Linear(512*7*7, D) with
    bias, features BatchNorm1d(D)."""
    total = torch_conv2d(3, 64, 3) + 2 * 64 + 64
    inplanes = 64
    for planes, count in zip((64, 128, 256, 512), layers):
        for block in range(count):
            total += 2 * inplanes + torch_conv2d(inplanes, planes, 3) + 2 * planes + planes \
                + torch_conv2d(planes, planes, 3) + 2 * planes
            if block == 0:
                total += torch_conv2d(inplanes, planes, 1) + 2 * planes
            inplanes = planes
    return total + 2 * 512 + 512 * 7 * 7 * num_features + num_features + 2 * num_features


@pytest.mark.parametrize('name', NETWORKS)
def test_output_shape_112(name):
    """Test that every network maps (N, 3, 112, 112) to embeddings (N, D)."""
    sym = get_symbol(name, embedding_size=256, image_size=112)
    assert sym.list_outputs() == ['embeddings_output']
    assert sym.list_arguments()[0] == 'data'
    _, out_shapes, _ = sym.infer_shape(data=(4, 3, 112, 112))
    assert out_shapes == [(4, 256)]


@pytest.mark.parametrize('name', ['r18', 'mbf', 'mbf_large'])
def test_output_shape_64(name):
    """Test that r18, mbf and mbf_large also build for 64x64 inputs (a 4x4 final map)."""
    sym = get_symbol(name, image_size=64)
    _, out_shapes, _ = sym.infer_shape(data=(3, 3, 64, 64))
    assert out_shapes == [(3, 512)]


@pytest.mark.parametrize('name,image_size', [('r50', 112), ('mbf_small', 112), ('mbf', 32),
                                             ('mbf_large', 32)])
def test_forward_backward_cpu(name, image_size):
    """Test that r50 and mbf_small (at 112 px) and mbf and mbf_large (at 32 px, to stay fast)
    run forward and backward on CPU with finite, non-zero gradients down to the first
    conv."""
    sym = get_symbol(name, image_size=image_size)
    exe = sym.simple_bind(ctx=mx.cpu(), data=(2, 3, image_size, image_size),
                          grad_req='write')
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
                                        ('r50', (3, 4, 14, 3)), ('r100', (3, 13, 30, 3)),
                                        ('r200', (6, 26, 60, 6))])
@pytest.mark.parametrize('embedding_size,image_size', [(512, 112), (128, 64)])
def test_iresnet_param_count(name, units, embedding_size, image_size):
    """Test that the IResNet parameter counts equal the hand-derived formula."""
    sym = get_symbol(name, embedding_size=embedding_size, image_size=image_size)
    assert count_params(sym, image_size) == iresnet_params(units, embedding_size, image_size)


@pytest.mark.parametrize('embedding_size,image_size', [(512, 112), (128, 112), (512, 64)])
def test_mobilefacenet_param_count(embedding_size, image_size):
    """Test that the paper's MobileFaceNet (mbf_small) has the hand-derived parameter count."""
    sym = get_symbol('mbf_small', embedding_size=embedding_size, image_size=image_size)
    assert count_params(sym, image_size) == mobilefacenet_params(embedding_size, image_size)


def layout_digest(sym, image_size):
    """SHA-256 of the ordered (name, shape) list of the arguments, then the aux states."""
    arg_shapes, _, aux_shapes = sym.infer_shape(data=(1, 3, image_size, image_size))
    layout = list(zip(sym.list_arguments(), arg_shapes)) \
        + list(zip(sym.list_auxiliary_states(), aux_shapes))
    text = repr([(name, tuple(shape)) for name, shape in layout])
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize('build', [
    lambda **kw: get_symbol('mbf_small', **kw),
    lambda **kw: get_mobilefacenet(blocks=(1, 4, 6, 2), scale=1, **kw),
], ids=['get_symbol', 'get_mobilefacenet'])
def test_mbf_small_unchanged_by_blocks_and_scale(build):
    """Test that 'mbf_small', and get_mobilefacenet at blocks (1, 4, 6, 2) and scale 1, build
    the symbol that was built (as 'mbf') before blocks and scale existed, so saved checkpoints
    load.

    The digests were recorded from that code (mxnet 1.9.1, whose version the JSON names):
    the argument and aux names and shapes in order, and the whole graph JSON at
    112 px / D 512 / float32 and at 64 px / D 128 / float16 / dropout 0.2. The JSON is
    built under a fresh NameManager: MXNet numbers unnamed nodes (`_minusscalar0`) with
    process-wide counters.
    """
    with mx.name.NameManager():
        sym = build()
    assert len(sym.list_arguments()) == 184 and len(sym.list_auxiliary_states()) == 100
    arg_shapes, _, _ = sym.infer_shape(data=(1, 3, 112, 112))
    shapes = dict(zip(sym.list_arguments(), arg_shapes))
    assert shapes['stem_dw_conv_weight'] == (64, 1, 3, 3)
    assert shapes['stage3_down_expand_conv_weight'] == (512, 128, 1, 1)
    assert shapes['stage2_unit6_project_conv_weight'] == (128, 256, 1, 1)
    assert shapes['conv_sep_conv_weight'] == (512, 128, 1, 1)
    assert shapes['gdc_conv_weight'] == (512, 1, 7, 7)
    assert shapes['embedding_fc_weight'] == (512, 512)
    assert layout_digest(sym, 112) == \
        'ce43190d08dbacd48499e840402a6f671b5ce76e38d9fffe89af35fe915b74ed'
    assert hashlib.sha256(sym.tojson().encode()).hexdigest() == \
        'bf802aca1c23b6782f3f829a2e764cb204b88da75de15a58f9646e9b9691cd37'
    with mx.name.NameManager():
        small = build(embedding_size=128, image_size=64, dtype='float16', dropout=0.2)
    assert hashlib.sha256(small.tojson().encode()).hexdigest() == \
        '1798440015bbc66f643245103e5cee82d5855df70ece6d8f4f5d1d98e17e16a5'


def test_mobilefacenet_scale_widths():
    """Test that scale multiplies the stem and stage channels but not the block widths,
    the stem's 64 groups or conv_sep's 512 (arcface_torch's MobileFaceNet), and that
    blocks[0] = 2 replaces the stem's grouped conv by two residual blocks of width 128."""
    def shapes(name):
        sym = get_symbol(name)
        arg_shapes, _, _ = sym.infer_shape(data=(1, 3, 112, 112))
        return dict(zip(sym.list_arguments(), arg_shapes))

    mbf2 = shapes('mbf')
    assert mbf2['stem_conv_weight'] == (128, 3, 3, 3)
    assert mbf2['stem_dw_conv_weight'] == (128, 2, 3, 3)            # 64 groups of 2
    assert mbf2['stage1_down_expand_conv_weight'] == (128, 128, 1, 1)
    assert mbf2['stage1_unit4_project_conv_weight'] == (128, 128, 1, 1)
    assert mbf2['stage2_down_project_conv_weight'] == (256, 256, 1, 1)
    assert mbf2['stage3_down_dw_conv_weight'] == (512, 1, 3, 3)
    assert mbf2['stage3_unit2_expand_conv_weight'] == (256, 256, 1, 1)
    assert mbf2['conv_sep_conv_weight'] == (512, 256, 1, 1)
    assert 'stage1_unit5_expand_conv_weight' not in mbf2

    large = shapes('mbf_large')
    assert large['stem_conv_weight'] == (256, 3, 3, 3)
    assert 'stem_dw_conv_weight' not in large
    assert large['stem_unit1_expand_conv_weight'] == (128, 256, 1, 1)
    assert large['stem_unit2_project_conv_weight'] == (256, 128, 1, 1)
    assert 'stem_unit3_expand_conv_weight' not in large
    assert large['stage1_unit8_dw_conv_weight'] == (128, 1, 3, 3)
    assert large['stage2_down_project_conv_weight'] == (512, 256, 1, 1)
    assert large['stage2_unit12_expand_conv_weight'] == (256, 512, 1, 1)
    assert large['stage3_unit4_project_conv_weight'] == (512, 256, 1, 1)
    assert large['conv_sep_conv_weight'] == (512, 512, 1, 1)
    assert large['gdc_conv_weight'] == (512, 1, 7, 7)


@pytest.mark.parametrize('name,arcface_torch', [
    ('mbf', lambda: arcface_torch_mbf_params((1, 4, 6, 2), 2)),
    ('mbf_large', lambda: arcface_torch_mbf_params((2, 8, 12, 4), 4)),
    ('r50', lambda: arcface_torch_iresnet_params((3, 4, 14, 3))),
    ('r100', lambda: arcface_torch_iresnet_params((3, 13, 30, 3))),
    ('r200', lambda: arcface_torch_iresnet_params((6, 26, 60, 6))),
])
def test_param_count_matches_arcface_torch(name, arcface_torch):
    """Test that our parameter counts (112 px, D 512) are within 1% of insightface's
    arcface_torch networks, summed by hand from its backbones/mobilefacenet.py (get_mbf:
    blocks (1, 4, 6, 2), scale 2; get_mbf_large: (2, 8, 12, 4), scale 4) and
    backbones/iresnet.py (iresnet50, 100, 200: layers (3, 4, 14, 3), (3, 13, 30, 3),
    (6, 26, 60, 6))."""
    count, want = count_params(get_symbol(name), 112), arcface_torch()
    assert abs(count - want) / want < 0.01, (name, count, want)


@pytest.mark.parametrize('kwargs,bad', [({'blocks': (1, 4, 6)}, '(1, 4, 6)'),
                                        ({'blocks': (1, 4, -1, 2)}, '(1, 4, -1, 2)'),
                                        ({'blocks': (1, 4.0, 6, 2)}, '(1, 4.0, 6, 2)'),
                                        ({'scale': 0}, '0'), ({'scale': 1.5}, '1.5'),
                                        ({'scale': True}, 'True')])
def test_bad_blocks_or_scale_raises(kwargs, bad):
    """Test that blocks other than 4 non-negative ints, or a scale that is not a positive
    int, raise ValueError naming the value."""
    with pytest.raises(ValueError) as err:
        get_mobilefacenet(**kwargs)
    assert 'got ' + bad in str(err.value)


@pytest.mark.parametrize('name,embedding_size,published', [
    # insightface's arcface_torch ONNX exports (512-d, fp32) as listed in PaddlePaddle
    # FastDeploy's examples/vision/faceid/insightface/README.md: r18 92MB, r34 131MB,
    # r50 167MB, r100 249MB; MiB / 4 bytes -> 24.1M, 34.3M, 43.8M, 65.3M values (the
    # files also hold the BN moving statistics). The insightface model zoo quotes
    # r50 43.6M and r100 65.2M.
    ('r18', 512, 92 * 2 ** 20 / 4), ('r34', 512, 131 * 2 ** 20 / 4),
    ('r50', 512, 43.6e6), ('r100', 512, 65.2e6),
    # MobileFaceNet paper (arXiv 1804.07573): 0.99M parameters with a 128-d output.
    ('mbf_small', 128, 0.99e6),
])
def test_param_count_matches_published(name, embedding_size, published):
    """Test that parameter counts agree with published figures within 2%."""
    count = count_params(get_symbol(name, embedding_size=embedding_size), 112)
    assert abs(count - published) / published < 0.02, (name, count, published)


def test_unknown_name_raises():
    """Test that an unknown network name raises ValueError naming it and the choices."""
    with pytest.raises(ValueError) as err:
        get_symbol('r152')
    assert "'r152'" in str(err.value)
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
    """Test that the package exports get_symbol, the descriptors (network, Network, FAMILIES), the
    two graph transforms and NETWORKS as a tuple."""
    assert symbols.NETWORKS == ('r18', 'r34', 'r50', 'r100', 'r200', 'mbf', 'mbf_large',
                                'mbf_small', 'vit_t', 'vit_t_dp005_mask0', 'vit_s', 'vit_s_dp005_mask_0', 'vit_b',
                                'vit_b_dp005_mask_005', 'vit_l_dp005_mask_005')
    assert set(symbols.__all__) == {'FAMILIES', 'NETWORKS', 'Network', 'UnknownNetwork', 'get_symbol', 'network',
                                    'with_frozen_batchnorm', 'with_learned_embedding_scale'}


@pytest.mark.parametrize('name', ['r50', 'mbf'])
def test_descriptor_is_the_network(name):
    """Test that a network's descriptor builds the symbol get_symbol builds, names its own
    family's layers (every layer it maps to arcface_torch is a layer of the symbol) and says
    arcface_torch's initialisation of that family (IResNets: normal convs; MobileFaceNets: fan-out)."""
    net = symbols.network(name)
    built, reference = net.symbol(128, 32), get_symbol(name, 128, 32)
    assert built.list_arguments() == reference.list_arguments()
    assert built.infer_shape(data=(1, 3, 32, 32)) == reference.infer_shape(data=(1, 3, 32, 32))
    arguments = set(reference.list_arguments())
    mapped = {ours for ours, _, _ in net.arcface_torch_layers()}
    assert mapped and all(any(arg.startswith(layer + '_') for arg in arguments) for layer in mapped)
    assert net.torch_init == {'iresnet': 'conv_normal_fc_uniform', 'mobilefacenet': 'fan_out_normal',
                              'vit': 'vit_trunc_normal'}[net.family]


@pytest.mark.parametrize('call', [lambda: get_symbol('convnext_t'), lambda: symbols.network('mbf_tiny'),
                                  lambda: initializers.backbone_initializer('arcface_torch', 'r51'),
                                  lambda: torch_backbone.layers('r51')])
def test_unknown_network_is_one_error_everywhere(call):
    """Test that a name no family holds is UnknownNetwork (naming the choices) wherever the
    toolkit asks about a network: never a silent MobileFaceNet."""
    with pytest.raises(symbols.UnknownNetwork, match='valid choices: r18, .*mbf_small, vit_t'):
        call()


def test_frozen_batchnorm_trains_with_the_moving_statistics_and_keeps_them():
    """Test that with_frozen_batchnorm's BatchNorm, in a training forward, is the NumPy affine map
    (x - moving_mean) / sqrt(moving_var + eps) * gamma + beta, its gradient gamma / sqrt(...),
    and leaves the moving statistics as they were; the plain one normalises by the batch."""
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (6, 4, 2, 2)).astype(np.float32)
    mean, var = rng.normal(size=4).astype(np.float32), rng.uniform(0.5, 2, 4).astype(np.float32)
    gamma, beta = rng.uniform(0.5, 2, 4).astype(np.float32), rng.normal(size=4).astype(np.float32)
    bn = mx.sym.BatchNorm(mx.sym.var('data'), name='bn', eps=1e-5, momentum=0.9, fix_gamma=False)
    outputs = {}
    for name, symbol in (('frozen', symbols.with_frozen_batchnorm(bn)), ('plain', bn)):
        module = mx.mod.Module(symbol, data_names=('data',), label_names=None)
        module.bind([('data', x.shape)], for_training=True, inputs_need_grad=True)
        module.init_params(arg_params={'bn_gamma': mx.nd.array(gamma), 'bn_beta': mx.nd.array(beta)},
                           aux_params={'bn_moving_mean': mx.nd.array(mean), 'bn_moving_var': mx.nd.array(var)})
        module.forward(mx.io.DataBatch([mx.nd.array(x)]), is_train=True)
        module.backward([mx.nd.ones(x.shape)])
        outputs[name] = (module.get_outputs()[0].asnumpy(), module.get_input_grads()[0].asnumpy(),
                         module._exec_group.aux_arrays[0][0].asnumpy())
    scale = (gamma / np.sqrt(var + 1e-5))[None, :, None, None]
    out, grad, moving_mean = outputs['frozen']
    np.testing.assert_allclose(out, (x - mean[None, :, None, None]) * scale + beta[None, :, None, None],
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, np.broadcast_to(scale, x.shape), rtol=1e-5)
    np.testing.assert_array_equal(moving_mean, mean)
    assert not np.allclose(outputs['plain'][0], out, atol=1e-2)
    assert not np.allclose(outputs['plain'][2], mean)


def test_prelu_matches_numpy_formula():
    """Test that the PReLU helper computes max(x, 0) + slope_c * min(x, 0) per channel, with
    slopes initialised to 0.25, and that its slope gradient matches the NumPy formula."""
    from sample_fc.symbols.common import prelu
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


def test_learned_embedding_scale_multiplies_the_embeddings_by_gamma():
    """Test that with_learned_embedding_scale's embeddings are gamma times the fixed-scale ones
    (inference, beta 0), and the plain network ignores gamma, as MXNet's fix_gamma does."""
    plain = symbols.get_symbol('mbf_small', 8, 32)
    learned = symbols.with_learned_embedding_scale(plain)
    rng = np.random.default_rng(0)
    data = mx.nd.array(rng.uniform(0, 255, (2, 3, 32, 32)))
    outputs = {}
    for name, symbol in (('plain', plain), ('learned', learned)):
        module = mx.mod.Module(symbol, data_names=('data',), label_names=None)
        module.bind([('data', data.shape)], for_training=False)
        mx.random.seed(3)
        module.init_params(mx.init.Xavier())
        arg_params, aux_params = module.get_params()
        arg_params['embeddings_gamma'] = mx.nd.array(np.linspace(0.5, 2.0, 8))
        module.set_params(arg_params, aux_params)
        module.forward(mx.io.DataBatch([data]), is_train=False)
        outputs[name] = module.get_outputs()[0].asnumpy()
    beta = 0.0   # Xavier leaves betas at 0
    np.testing.assert_allclose(outputs['learned'] - beta, (outputs['plain'] - beta) * np.linspace(0.5, 2.0, 8),
                               rtol=1e-4, atol=1e-5)


# arcface_torch's ViTs at 112 px, num_features 512: sum(p.numel() for p in model.parameters()) and
# the parameter tensors of backbones/vit.py's VisionTransformer (insightface 7fadd420, built with
# get_model's arguments outside this repository), each including the mask token (1, 1, width)
ARCFACE_TORCH_VIT = {'vit_t': (19137792, 144), 'vit_s': (76023296, 144), 'vit_b': (113833472, 276),
                     'vit_l_dp005_mask_005': (255684352, 276)}


def vit_params(width, depth, tokens, num_features=512):
    """By hand: the patch conv (3 x 9 x 9 -> width, with bias), the position embedding, per block
    two LayerNorms, qkv (no bias), proj, fc1 (4 x width), fc2; the final LayerNorm; the head's
    Linear(tokens x width -> width), BatchNorm1d, Linear(width -> D), BatchNorm1d."""
    block = 2 * 2 * width + 3 * width * width + (width * width + width) + (4 * width * width + 4 * width) \
        + (4 * width * width + width)
    return (3 * 81 * width + width) + tokens * width + depth * block + 2 * width \
        + tokens * width * width + 2 * width + width * num_features + 2 * num_features


@pytest.mark.parametrize('name', sorted(ARCFACE_TORCH_VIT))
def test_vit_param_count_matches_arcface_torch(name):
    """Test that each ViT at 112 px has arcface_torch's parameters (those with patch masking: its
    mask token; the _mask0 ones do not use it: less the mask token), counted from the symbol,
    equal to the hand formula; and that every variant of a width and depth is the same network
    but for the mask token."""
    width, depth, _, mask_ratio = symbols.network(name).shape
    ours, tensors = count_params(get_symbol(name, 512, 112), 112), len(get_symbol(name, 512, 112).list_arguments()) - 1
    unused = 0 if mask_ratio > 0 else 1
    assert ours == vit_params(width, depth, 144) + width * (1 - unused) == ARCFACE_TORCH_VIT[name][0] - width * unused
    assert tensors == ARCFACE_TORCH_VIT[name][1] - unused
    from sample_fc.symbols.cost import backbone_cost      # per image: 12 W^2 per token per block and the attention's 2 L^2 W
    tokens, heads_of_work = 144, 12 * 144 * width * width + 2 * 144 * 144 * width
    assert backbone_cost(get_symbol(name, 512, 112), 112).multiply_adds == \
        depth * heads_of_work + tokens * 243 * width + tokens * width * width + width * 512
    for other in symbols.NETWORKS:
        if other.startswith('vit') and symbols.network(other).shape[:2] == (width, depth):
            masked = [n for n in get_symbol(name, 512, 112).list_arguments() if n != 'mask_token']
            assert [n for n in get_symbol(other, 512, 112).list_arguments() if n != 'mask_token'] == masked


def test_drop_path_drops_whole_samples_in_training_only():
    """Test the drop path of a ViT block (MXNet's Dropout with the mask over a sample's tokens and
    channels): in training each sample's branch is all zeros or all 1 / (1 - p), both seen; at
    inference it is the identity."""
    from sample_fc.symbols.vit import drop_path
    branch = drop_path(mx.sym.Variable('x'), 'drop', 0.5)
    ones = mx.nd.ones((64, 9, 16))
    trained = branch.bind(mx.cpu(), {'x': ones}).forward(is_train=True)[0].asnumpy()
    per_sample = trained.reshape(64, -1)
    assert (per_sample == per_sample[:, :1]).all()
    assert set(np.unique(per_sample)) == {0.0, 2.0}
    inferred = branch.bind(mx.cpu(), {'x': ones}).forward(is_train=False)[0].asnumpy()
    np.testing.assert_array_equal(inferred, 1.0)


def test_a_vits_parameters_fix_its_input_side():
    """Test that a ViT's parameters fit its symbol at the side it was built for only: the position
    embedding is broadcast along the batch, not over the tokens, so a smaller input (one token at
    16 px) is a shape error rather than a graph that runs (the tools infer --image-size from the
    parameters; with a token-wide broadcast 16 px fit too)."""
    from sample_fc.models.saved_model import infer_image_size, params_fit
    symbol = get_symbol('vit_t', 64, 32)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, 32, 32))
    args = {n: mx.nd.zeros(s) for n, s in zip(symbol.list_arguments(), arg_shapes) if n != 'data'}
    aux = {n: mx.nd.zeros(s) for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)}
    assert [side for side in (16, 32, 48, 64) if params_fit(symbol, args, aux, side)] == [32]
    assert infer_image_size(symbol, args, aux) == 32


def _masking_vit(mask_ratio):
    """A small ViT (width 16, depth 2, 32 px: 9 tokens, no drop path) with the given masking."""
    from sample_fc.symbols.vit import get_vit
    return get_vit(8, 32, width=16, depth=2, drop_rate=0.0, mask_ratio=mask_ratio)


def _patch_flipped(pixels, sample, token):
    """A copy of `pixels` with the 9 x 9 patch of token `token` of `sample` inverted."""
    row, col = divmod(token, 3)
    moved = pixels.copy()
    moved[sample, :, row * 9:(row + 1) * 9, col * 9:(col + 1) * 9] *= -1
    moved[sample, :, row * 9:(row + 1) * 9, col * 9:(col + 1) * 9] += 255
    return moved


def test_patch_masking_leaves_tokens_out_in_training_and_nothing_at_inference():
    """Test arcface_torch's patch masking on a small ViT with random weights: in training (a graph
    bound with gradients, as the module binds it) about mask_ratio of the tokens are left out (the
    keep mask read from the graph); after the final LayerNorm a left-out token is the mask token
    and a kept one is unchanged; inverting the pixels of a left-out patch changes no embedding
    (it is no key of any attention), inverting a kept one does; at inference nothing is masked:
    the embeddings are the unmasked network's with the same weights."""
    symbol = _masking_vit(0.3)
    internals = symbol.get_internals()
    head_input = internals['feature_fc_output'].get_children()[0]           # the tokens, flattened
    probe = mx.sym.Group([symbol, internals['patch_mask_output'], internals['norm_output'], head_input])
    batch = 64
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(batch, 3, 32, 32))
    rng = np.random.default_rng(3)
    args = {n: mx.nd.array(rng.normal(0, 0.3, s)) for n, s in zip(symbol.list_arguments(), arg_shapes) if n != 'data'}
    aux = {n: mx.nd.array(rng.uniform(0.5, 2, s)) for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)}
    pixels = rng.uniform(0, 255, (batch, 3, 32, 32)).astype(np.float32)

    def run(graph, images, is_train):
        mx.random.seed(11)                    # the same draw of the keep mask every time
        weights = {n: v for n, v in args.items() if n in graph.list_arguments()}
        grads = {n: mx.nd.zeros(v.shape) for n, v in weights.items()} if is_train else None
        bound = graph.bind(mx.cpu(), dict(weights, data=mx.nd.array(images)), args_grad=grads,
                           aux_states={k: v.copy() for k, v in aux.items()})
        return [out.asnumpy() for out in bound.forward(is_train=is_train)]

    embeddings, keep, normed, tokens = run(probe, pixels, True)
    keep = keep[:, :, 0] > 0                                                # (N, 9)
    assert 0.2 < 1 - keep.mean() < 0.4
    tokens = tokens.reshape(batch, 9, 16)
    token = args['mask_token'].asnumpy()[0, 0]
    np.testing.assert_allclose(tokens[~keep], np.broadcast_to(token, tokens[~keep].shape), rtol=1e-6)
    np.testing.assert_array_equal(tokens[keep], normed[keep])
    assert np.abs(normed[~keep] - token).max() > 0.1                         # the LayerNorm's were others
    sample = next(n for n in range(batch) if 0 < keep[n].sum() < 9)
    left_out, kept = int(np.flatnonzero(~keep[sample])[0]), int(np.flatnonzero(keep[sample])[0])
    np.testing.assert_array_equal(run(symbol, _patch_flipped(pixels, sample, left_out), True)[0][sample],
                                  embeddings[sample])
    assert np.abs(run(symbol, _patch_flipped(pixels, sample, kept), True)[0][sample] - embeddings[sample]).max() > 1e-3
    np.testing.assert_allclose(run(symbol, pixels, False)[0], run(_masking_vit(0.0), pixels, False)[0],
                               rtol=1e-5, atol=1e-6)


def test_a_network_of_an_existing_family_is_one_line_of_the_catalog(tmp_path):
    """Test that a new IResNet written as one line of a copy of sample_fc/symbols/catalog.py (nothing else
    changed) is a preset of the configuration, a descriptor that builds a symbol with the
    parameters its units give (the r18 stem, stages and head plus one more unit per stage), and
    a network train.py resolves."""
    import json
    import subprocess
    import sys
    from conftest import package_copy
    env = package_copy(tmp_path, ("default.py", "train.py"))     # train.py's folder comes first on its path
    catalog = tmp_path / "sample_fc" / "symbols" / "catalog.py"
    text = catalog.read_text()
    assert text.count("ENTRIES = {\n") == 1
    catalog.write_text(text.replace("ENTRIES = {\n", "ENTRIES = {\n    'r22': Entry('iresnet', (3, 3, 3, 3)),\n"))
    script = """
import json, sys
import default
from sample_fc import symbols
from sample_fc.symbols.cost import backbone_cost
cfg = default.get_config('emore', 'r22')
params = {n: symbols.get_symbol(n, 512, 112).infer_shape(data=(1, 3, 112, 112))[0] for n in ('r18', 'r22')}
sizes = {n: sum(int(__import__('numpy').prod(s)) for s in shapes) for n, shapes in params.items()}
print(json.dumps({'in_networks': 'r22' in default.NETWORKS, 'batch': cfg.batch_size, 'sizes': sizes,
                  'family': symbols.network('r22').family}))
"""
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                           cwd=str(tmp_path))
    assert found.returncode == 0, found.stderr[-3000:]
    facts = json.loads(found.stdout.strip().splitlines()[-1])
    assert facts["in_networks"] and facts["batch"] == 128 and facts["family"] == "iresnet"
    channels = (64, 128, 256, 512)        # one more unit per stage: two 3x3 convs, 3 BNs (gamma, beta), a PReLU
    one_more = sum(2 * 9 * c * c + 3 * 2 * c + c for c in channels)
    assert facts["sizes"]["r22"] - facts["sizes"]["r18"] == one_more, facts["sizes"]
    printed = subprocess.run([sys.executable, str(tmp_path / "train.py"), "--dataset", "synthetic_1m", "--network", "r22",
                              "--print-config"], capture_output=True, text=True, timeout=300, env=env,
                             cwd=str(tmp_path))
    assert printed.returncode == 0 and json.loads(printed.stdout)["network"] == "r22", printed.stderr[-3000:]
