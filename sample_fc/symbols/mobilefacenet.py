"""MobileFaceNet backbones ('mbf', 'mbf_large', 'mbf_small') as MXNet symbols.

MobileFaceNet (Chen et al., arXiv 1804.07573, Table 1), generalised as insightface's
arcface_torch/backbones/mobilefacenet.py: `blocks` gives the number of residual blocks of
the stem and of the three stages, `scale` multiplies the channels between blocks. Layout
for a 112x112 input; the channels marked * are multiplied by `scale`:

    stem      conv3x3 64* s2, then                                      56x56x64*
              if blocks[0] == 1: grouped conv3x3 64*, 64 groups (depthwise at scale 1)
              else: blocks[0] residual blocks (width 128)
    stage1    down block to 64* (width 128), blocks[1] residual blocks (128)  28x28x64*
    stage2    down block to 128* (width 256), blocks[2] residual blocks (256) 14x14x128*
    stage3    down block to 128* (width 512), blocks[3] residual blocks (256)  7x7x128*
    conv_sep  conv1x1 512                                                    7x7x512
    gdc       linear global depthwise conv, kernel = final map (7x7)         1x1x512
    head      Flatten -> FC(embedding_size) -> BN                           'embeddings'

`scale` does not touch the block widths, the stem's 64 groups, conv_sep's 512 channels or
the GDC. A block is an inverted residual: conv1x1 to its width -> depthwise conv3x3 (stride
2 in a down block) -> linear conv1x1 back to the stage's channels. Residual blocks add
their input; down blocks do not. Every conv is followed by BN, and by PReLU except the
linear ones.

blocks=(1, 4, 6, 2), scale=1 ('mbf_small') is the paper's network; its widths are the paper's
expansion factors t=2, or t=4 for the blocks going down to stages 2 and 3. 'mbf' is that
network at scale 2, as arcface_torch's get_mbf (the network behind its published numbers and
what the field calls "mbf"); sample_fc called the paper's network 'mbf' before, and a run
saved under that name resumes as 'mbf_small' (sample_fc.run.resume).
"""
import mxnet as mx

from .common import _is_int, check_args, conv_bn, embedding_head, input_data
from . import catalog
from .network import Network

STEM_CHANNELS = 64       # times scale
STEM_GROUPS = 64         # groups of the stem's second conv when blocks[0] == 1; not scaled
STEM_BLOCK_WIDTH = 128   # width of the stem's residual blocks when blocks[0] != 1
SEP_CHANNELS = 512       # conv_sep and GDC channels; not scaled

# (out channels at scale 1, width of the down block, width of the residual blocks,
#  residual blocks of 'mbf'); get_mobilefacenet takes the residual blocks from `blocks`
STAGES = (
    (64, 128, 128, 4),
    (128, 256, 256, 6),
    (128, 512, 256, 2),
)

# network name -> (blocks, scale), as arcface_torch's MobileFaceNet(blocks, scale)
CONFIGS = {name: entry.shape for name, entry in catalog.of_family('mobilefacenet').items()}   # (blocks, scale)


def inverted_residual(data, name, width, out_channels, stride):
    """conv1x1 width -> depthwise conv3x3 -> linear conv1x1 out_channels."""
    body = conv_bn(data, name + '_expand', width, kernel=1)
    body = conv_bn(body, name + '_dw', width, kernel=3, stride=stride, num_group=width)
    return conv_bn(body, name + '_project', out_channels, kernel=1, act=False)


def residual_blocks(data, prefix, width, channels, count):
    """`count` stride-1 inverted residuals `<prefix>_unit1`, ... that add their input."""
    body = data
    for unit in range(1, count + 1):
        name = '%s_unit%d' % (prefix, unit)
        branch = inverted_residual(body, name, width, channels, stride=1)
        body = mx.sym.elemwise_add(body, branch, name=name + '_add')
    return body


def check_blocks_scale(blocks, scale):
    """Raise ValueError unless blocks is 4 non-negative ints and scale a positive int."""
    if not isinstance(blocks, (tuple, list)) or len(blocks) != 4 \
            or not all(_is_int(count) and count >= 0 for count in blocks):
        raise ValueError('blocks must be 4 non-negative ints, got %r' % (blocks,))
    if not _is_int(scale) or scale <= 0:
        raise ValueError('scale must be a positive int, got %r' % (scale,))


def get_mobilefacenet(embedding_size=512, image_size=112, dtype='float32', dropout=0.0,
                      blocks=(1, 4, 6, 2), scale=1):
    """The MobileFaceNet symbol: input `data` (N, 3, image_size, image_size), output
    `embeddings` (N, embedding_size). Dropout, if any, acts just before the FC.

    blocks: residual blocks of the stem (1 means the grouped conv3x3 instead) and of
            stages 1-3; scale: multiplier of the stem and stage channels.
    """
    side = check_args(embedding_size, image_size, dtype, dropout)
    check_blocks_scale(blocks, scale)
    stem_channels = STEM_CHANNELS * scale

    # stem: halve the resolution, then one grouped conv or blocks[0] residual blocks
    body = conv_bn(input_data(dtype), 'stem', stem_channels, kernel=3, stride=2)
    if blocks[0] == 1:
        body = conv_bn(body, 'stem_dw', stem_channels, kernel=3, num_group=STEM_GROUPS)
    else:
        body = residual_blocks(body, 'stem', STEM_BLOCK_WIDTH, stem_channels, blocks[0])

    # three stages: a strided block without shortcut, then residual blocks
    for stage, (channels, down_width, width, _) in enumerate(STAGES, start=1):
        prefix = 'stage%d' % stage
        body = inverted_residual(body, prefix + '_down', down_width, channels * scale,
                                 stride=2)
        body = residual_blocks(body, prefix, width, channels * scale, blocks[stage])

    # 1x1 conv to 512 channels, then the linear global depthwise conv (GDC) over the
    # whole side x side map
    body = conv_bn(body, 'conv_sep', SEP_CHANNELS, kernel=1)
    body = conv_bn(body, 'gdc', SEP_CHANNELS, kernel=side, num_group=SEP_CHANNELS, pad=0,
                   act=False)
    return embedding_head(body, int(embedding_size), dtype, float(dropout), fc_bias=False)


def _conv_bn_layers(ours, theirs, act=True):
    found = [(ours + '_conv', theirs + '.layers.0', 'conv'), (ours + '_bn', theirs + '.layers.1', 'bn')]
    return found + ([(ours + '_prelu', theirs + '.layers.2', 'prelu')] if act else [])


def _inverted_residual_layers(ours, theirs):
    return (_conv_bn_layers(ours + '_expand', theirs + '.layers.0')
            + _conv_bn_layers(ours + '_dw', theirs + '.layers.1')
            + _conv_bn_layers(ours + '_project', theirs + '.layers.2', act=False))


def arcface_torch_layers(name):
    """[(our layer, its module in arcface_torch's mobilefacenet, kind)]: a conv_bn X_{conv,bn,prelu}
    <- the ConvBlock/LinearBlock Y.layers.{0,1,2}: stem <- layers.0; stem_dw <- layers.1 (or
    stem_unitK <- layers.1.layers.(K-1)); stageS_down <- layers.(2S), stageS_unitK <-
    layers.(2S+1).layers.(K-1), each an inverted residual _expand, _dw, _project <- .layers.{0,1,2};
    conv_sep <- conv_sep; gdc <- features.layers.0; embedding_fc <- features.layers.2; embeddings
    <- features.layers.3."""
    blocks = CONFIGS[name][0]
    found = _conv_bn_layers('stem', 'layers.0')
    if blocks[0] == 1:
        found += _conv_bn_layers('stem_dw', 'layers.1')
    for unit in range(blocks[0] if blocks[0] != 1 else 0):
        found += _inverted_residual_layers('stem_unit%d' % (unit + 1), 'layers.1.layers.%d' % unit)
    for stage in range(1, 4):
        found += _inverted_residual_layers('stage%d_down' % stage, 'layers.%d' % (2 * stage))
        for unit in range(blocks[stage]):
            found += _inverted_residual_layers('stage%d_unit%d' % (stage, unit + 1),
                                               'layers.%d.layers.%d' % (2 * stage + 1, unit))
    return found + _conv_bn_layers('conv_sep', 'conv_sep') + _conv_bn_layers('gdc', 'features.layers.0', act=False) + \
        [('embedding_fc', 'features.layers.2', 'fc_no_bias'), ('embeddings', 'features.layers.3', 'bn')]


def _build(name, embedding_size, image_size, dtype, dropout):
    blocks, scale = CONFIGS[name]
    return get_mobilefacenet(embedding_size, image_size, dtype, dropout, blocks, scale)


NETWORKS = {name: Network(name, 'mobilefacenet', entry.shape, _build, arcface_torch_layers,
                          torch_init='fan_out_normal', onednn_extra=entry.onednn_extra)
            for name, entry in catalog.of_family('mobilefacenet').items()}
