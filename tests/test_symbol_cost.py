"""Tests for symbols/cost.py: parameters, aux states and multiply-adds of a symbol."""
import mxnet as mx
import pytest

from sample_fc.symbols import NETWORKS, get_symbol
from sample_fc.symbols.common import prelu
from sample_fc.symbols.cost import backbone_cost


# ---- multiply-adds worked out by hand from the architecture descriptions ----

def conv_madds(side_out, c_in, c_out, k, groups=1):
    """side_out^2 output positions x c_out filters x k*k*c_in/groups multiply-adds each."""
    return side_out * side_out * c_out * k * k * c_in // groups


def mobilefacenet_madds(blocks, scale, embedding_size, image_size):
    """MobileFaceNet as arcface_torch lays it out (see symbols/mobilefacenet.py): stem conv3x3
    s2, then the grouped conv3x3 (64 groups) or blocks[0] residual blocks of width 128; three
    stages of a down block and residual blocks; conv_sep 1x1 to 512; GDC; FC 512 -> D."""
    def block(side_in, c_in, width, c_out, stride):   # expand 1x1, depthwise 3x3, project
        side_out = side_in // stride
        return conv_madds(side_in, c_in, width, 1) \
            + conv_madds(side_out, width, width, 3, groups=width) \
            + conv_madds(side_out, width, c_out, 1)

    c64, c128 = 64 * scale, 128 * scale
    side = image_size // 2
    total = conv_madds(side, 3, c64, 3)
    if blocks[0] == 1:
        total += conv_madds(side, c64, c64, 3, groups=64)
    else:
        total += blocks[0] * block(side, c64, 128, c64, 1)
    c_in = c64
    for c_out, down_width, width, count in ((c64, 128, 128, blocks[1]),
                                            (c128, 256, 256, blocks[2]),
                                            (c128, 512, 256, blocks[3])):
        total += block(side, c_in, down_width, c_out, 2)
        side //= 2
        total += count * block(side, c_out, width, c_out, 1)
        c_in = c_out
    total += conv_madds(side, c128, 512, 1) + conv_madds(1, 512, 512, side, groups=512)
    return total + 512 * embedding_size


def iresnet_madds(units, embedding_size, image_size):
    """IResNet: stem conv3x3 3->64 at full resolution; per unit conv3x3 c_in->c at the input
    resolution, conv3x3 c->c at the output resolution (stride 2 in the first unit of a
    stage, which also has a conv1x1 shortcut at the output resolution); FC 512*s*s -> D."""
    side = image_size
    total = conv_madds(side, 3, 64, 3)
    c_in = 64
    for c, count in zip((64, 128, 256, 512), units):
        for unit in range(count):
            side_out = side // 2 if unit == 0 else side
            total += conv_madds(side, c_in, c, 3) + conv_madds(side_out, c, c, 3)
            if unit == 0:
                total += conv_madds(side_out, c_in, c, 1)
            side, c_in = side_out, c
    return total + 512 * side * side * embedding_size


# ---- tests ----

def test_tiny_symbol_by_hand():
    """Test that a conv, a BN, a grouped strided conv with a 3x1 kernel and an FC with bias
    cost what they cost by hand at 8 px:
    conv 3->6, 3x3, pad 1:           out 6x8x8 = 384 elements x 3*3*3   = 10368
    conv 6->4, 3x1, 2 groups, s2:    out 4x4x4 =  64 elements x 3*1*6/2 =   576
    FC 64 -> 5:                                                  64 x 5 =   320
    params 162 + 12 (BN) + 36 + 64*5 + 5 = 535; aux 12 (BN moving mean and var)."""
    body = mx.sym.Convolution(mx.sym.Variable('data'), num_filter=6, kernel=(3, 3),
                              pad=(1, 1), no_bias=True, name='conv1')
    body = mx.sym.BatchNorm(body, name='bn1')
    body = mx.sym.Convolution(body, num_filter=4, kernel=(3, 1), stride=(2, 2), pad=(1, 0),
                              num_group=2, no_bias=True, name='conv2')
    body = mx.sym.FullyConnected(body, num_hidden=5, name='fc')
    cost = backbone_cost(body, 8)
    assert cost.multiply_adds == 10368 + 576 + 320
    assert cost.params == 162 + 12 + 36 + 64 * 5 + 5
    assert cost.aux == 12


def test_prelu_not_counted():
    """Test that the PReLU helper's slope convolution adds no multiply-adds but its 6
    slopes count as parameters."""
    body = mx.sym.Convolution(mx.sym.Variable('data'), num_filter=6, kernel=(1, 1),
                              no_bias=True, name='conv')
    cost = backbone_cost(prelu(body, 'act', 6), 4)
    assert cost.multiply_adds == 4 * 4 * 6 * 3
    assert cost.params == 6 * 3 + 6
    assert cost.aux == 0


@pytest.mark.parametrize('name,blocks,scale', [('mbf_small', (1, 4, 6, 2), 1),
                                               ('mbf', (1, 4, 6, 2), 2),
                                               ('mbf_large', (2, 8, 12, 4), 4)])
@pytest.mark.parametrize('embedding_size,image_size', [(512, 112), (128, 64)])
def test_mobilefacenet_madds_by_hand(name, blocks, scale, embedding_size, image_size):
    """Test that the MobileFaceNet multiply-adds equal the hand-derived formula."""
    sym = get_symbol(name, embedding_size=embedding_size, image_size=image_size)
    assert backbone_cost(sym, image_size).multiply_adds == \
        mobilefacenet_madds(blocks, scale, embedding_size, image_size)


@pytest.mark.parametrize('name,units', [('r50', (3, 4, 14, 3)), ('r200', (6, 26, 60, 6))])
def test_iresnet_madds_by_hand(name, units):
    """Test that the IResNet multiply-adds at 112 px equal the hand-derived formula."""
    assert backbone_cost(get_symbol(name), 112).multiply_adds == \
        iresnet_madds(units, 512, 112)


@pytest.mark.parametrize('embedding_size', [128, 512])
def test_mbf_small_madds_match_paper(embedding_size):
    """Test that mbf_small (the paper's net) at 112 px is within 5% of the MobileFaceNet paper's 221M MAdds
    (arXiv 1804.07573, Table 2; its last layer maps 512 -> 128, ours 512 -> D)."""
    madds = backbone_cost(get_symbol('mbf_small', embedding_size=embedding_size), 112).multiply_adds
    assert abs(madds - 221e6) / 221e6 < 0.05, madds


def test_r100_madds_match_published():
    """Test that r100 at 112 px is within 1% of half the 24.209 GFLOPs (one FLOP per
    multiply and per add) that OpenVINO's open_model_zoo lists for insightface's
    LResNet100E-IR (models/public/face-recognition-resnet100-arcface)."""
    madds = backbone_cost(get_symbol('r100'), 112).multiply_adds
    assert abs(madds - 24.209e9 / 2) / (24.209e9 / 2) < 0.01, madds


def test_params_and_aux_of_mbf_small():
    """Test that mbf_small's params are the paper's 0.99M at D 128 (within 2%) and its aux states
    equal its BN gamma + beta count: every BN has a moving mean and variance per channel."""
    sym = get_symbol('mbf_small', embedding_size=128)
    cost = backbone_cost(sym, 112)
    assert abs(cost.params - 0.99e6) / 0.99e6 < 0.02
    arg_shapes, _, _ = sym.infer_shape(data=(1, 3, 112, 112))
    bn_params = sum(shape[0] for name, shape in zip(sym.list_arguments(), arg_shapes)
                    if name.endswith(('_bn_gamma', '_bn_beta', 'embeddings_gamma',
                                      'embeddings_beta')))
    assert cost.aux == bn_params


def test_train_help_lists_every_network_with_its_size_and_cost():
    """Test that `train.py --help` lists every network with its parameters and multiply-adds
    at 112 px, D 512: the counts derived by hand in tests/test_symbols.py (arcface_torch's
    layouts) and the MobileFaceNet paper's 0.22 G multiply-adds for mbf_small."""
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(repo / 'train.py'), '--help'], capture_output=True,
                            text=True, timeout=120, cwd=str(repo))
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()
            if line.startswith('  ') and 'multiply-adds' in line}
    assert sorted(rows) == sorted(NETWORKS)
    from test_symbols import arcface_torch_iresnet_params, arcface_torch_mbf_params
    want = {'r50': arcface_torch_iresnet_params((3, 4, 14, 3)), 'r200': arcface_torch_iresnet_params((6, 26, 60, 6)),
            'mbf': arcface_torch_mbf_params((1, 4, 6, 2), 2), 'mbf_large': arcface_torch_mbf_params((2, 8, 12, 4), 4)}
    for name, count in want.items():
        assert rows[name][1] == '%.2fM' % (count / 1e6), rows[name]
    assert rows['mbf_small'][3] == '0.22'
