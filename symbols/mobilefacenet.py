"""MobileFaceNet backbone ('mbf') as an MXNet symbol.

MobileFaceNet (Chen et al., arXiv 1804.07573, Table 1) in insightface's configuration
blocks=(1, 4, 6, 2). Layout for a 112x112 input:

    stem      conv3x3 64 s2 -> depthwise conv3x3 64                       56x56x64
    stage1    down block to 64 (width 128), then 4 residual blocks (128)   28x28x64
    stage2    down block to 128 (width 256), then 6 residual blocks (256)  14x14x128
    stage3    down block to 128 (width 512), then 2 residual blocks (256)   7x7x128
    conv_sep  conv1x1 512                                                  7x7x512
    gdc       linear global depthwise conv, kernel = final map (7x7)       1x1x512
    head      Flatten -> FC(embedding_size) -> BN                         'embeddings'

A block is an inverted residual: conv1x1 to its width -> depthwise conv3x3 (stride 2 in a
down block) -> linear conv1x1 back to the stage's channels. The width is the expansion
factor t times the input channels: t=2, except t=4 for the blocks going down to stages 2
and 3 (the paper's table). Residual blocks add their input; down blocks do not.
Every conv is followed by BN, and by PReLU except the linear ones.
"""
import mxnet as mx

from .common import check_args, conv_bn, embedding_head, input_data

STEM_CHANNELS = 64
SEP_CHANNELS = 512

# (out channels, width of the down block, width of the residual blocks, residual blocks)
STAGES = (
    (64, 128, 128, 4),
    (128, 256, 256, 6),
    (128, 512, 256, 2),
)


def inverted_residual(data, name, width, out_channels, stride):
    """conv1x1 width -> depthwise conv3x3 -> linear conv1x1 out_channels."""
    body = conv_bn(data, name + '_expand', width, kernel=1)
    body = conv_bn(body, name + '_dw', width, kernel=3, stride=stride, num_group=width)
    return conv_bn(body, name + '_project', out_channels, kernel=1, act=False)


def get_mobilefacenet(embedding_size=512, image_size=112, dtype='float32', dropout=0.0):
    """The MobileFaceNet symbol: input `data` (N, 3, image_size, image_size), output
    `embeddings` (N, embedding_size). Dropout, if any, acts just before the FC."""
    side = check_args(embedding_size, image_size, dtype, dropout)

    # stem: halve the resolution, then one depthwise conv
    body = conv_bn(input_data(dtype), 'stem', STEM_CHANNELS, kernel=3, stride=2)
    body = conv_bn(body, 'stem_dw', STEM_CHANNELS, kernel=3, num_group=STEM_CHANNELS)

    # three stages: a strided block without shortcut, then residual blocks
    for stage, (channels, down_width, width, units) in enumerate(STAGES, start=1):
        prefix = 'stage%d' % stage
        body = inverted_residual(body, prefix + '_down', down_width, channels, stride=2)
        for unit in range(1, units + 1):
            name = '%s_unit%d' % (prefix, unit)
            branch = inverted_residual(body, name, width, channels, stride=1)
            body = mx.sym.elemwise_add(body, branch, name=name + '_add')

    # 1x1 conv to 512 channels, then the linear global depthwise conv (GDC) over the
    # whole side x side map
    body = conv_bn(body, 'conv_sep', SEP_CHANNELS, kernel=1)
    body = conv_bn(body, 'gdc', SEP_CHANNELS, kernel=side, num_group=SEP_CHANNELS, pad=0,
                   act=False)
    return embedding_head(body, int(embedding_size), dtype, float(dropout), fc_bias=False)
