"""IResNet backbones (r18, r34, r50, r100, r200) as MXNet symbols.

The "improved" pre-activation ResNet of ArcFace (arXiv 1801.07698), as in insightface's
arcface_torch/backbones/iresnet.py. Layout for a 112x112 input:

    stem      conv3x3 64 s1 -> BN -> PReLU                          112x112x64
    stage1-4  units with 64, 128, 256, 512 channels; the first unit  56, 28, 14, 7
              of every stage has stride 2
    head      BN -> Dropout -> Flatten -> FC(embedding_size) -> BN   'embeddings'

A unit is  BN -> conv3x3 s1 -> BN -> PReLU -> conv3x3 s -> BN,  plus a shortcut that is
the identity, or conv1x1 s -> BN where the shape changes (the first unit of a stage).
There is no activation after the sum.
"""
import mxnet as mx

from .common import (batch_norm, check_args, conv, conv_bn, embedding_head, input_data,
                     prelu)
from . import catalog
from .network import Network

STAGE_CHANNELS = (64, 128, 256, 512)
STEM_CHANNELS = 64

# units per stage of each IResNet of the catalog (as arcface_torch's iresnet18, ..., iresnet200)
UNITS = {name: entry.shape for name, entry in catalog.of_family('iresnet').items()}


def residual_unit(data, name, in_channels, channels, stride):
    """One IBasicBlock; layers are named `<name>_bn1`, `<name>_conv1`, ... ."""
    body = batch_norm(data, name + '_bn1')
    body = conv(body, name + '_conv1', channels, kernel=3, stride=1)
    body = batch_norm(body, name + '_bn2')
    body = prelu(body, name + '_prelu', channels)
    body = conv(body, name + '_conv2', channels, kernel=3, stride=stride)
    body = batch_norm(body, name + '_bn3')

    if stride == 1 and in_channels == channels:
        shortcut = data
    else:
        shortcut = conv(data, name + '_shortcut_conv', channels, kernel=1, stride=stride)
        shortcut = batch_norm(shortcut, name + '_shortcut_bn')
    return mx.sym.elemwise_add(body, shortcut, name=name + '_add')


def get_iresnet(name, embedding_size=512, image_size=112, dtype='float32', dropout=0.0):
    """The IResNet symbol `name` (a key of UNITS): input `data`
    (N, 3, image_size, image_size), output `embeddings` (N, embedding_size)."""
    if name not in UNITS:
        raise ValueError('unknown IResNet %r; valid choices: %s' % (name, ', '.join(UNITS)))
    check_args(embedding_size, image_size, dtype, dropout)

    # stem: full resolution, 64 channels
    body = conv_bn(input_data(dtype), 'stem', STEM_CHANNELS, kernel=3, stride=1)

    # four stages, each halving the resolution in its first unit
    in_channels = STEM_CHANNELS
    for stage, (channels, units) in enumerate(zip(STAGE_CHANNELS, UNITS[name]), start=1):
        for unit in range(1, units + 1):
            body = residual_unit(body, 'stage%d_unit%d' % (stage, unit), in_channels,
                                 channels, stride=2 if unit == 1 else 1)
            in_channels = channels

    # head: BN over the final (image_size/16)^2 x 512 map, then the embedding layer
    body = batch_norm(body, 'features_bn')
    return embedding_head(body, int(embedding_size), dtype, float(dropout), fc_bias=True)


# each IBasicBlock layer of ours and its arcface_torch module (the same name), with its kind
IBASIC_BLOCK = (('bn1', 'bn'), ('conv1', 'conv'), ('bn2', 'bn'), ('prelu', 'prelu'), ('conv2', 'conv'), ('bn3', 'bn'))


def arcface_torch_layers(name):
    """[(our layer, its module in arcface_torch's iresnet, kind)]: stem_{conv,bn,prelu} <- conv1,
    bn1, prelu; stageS_unitU_<layer> <- layerS.(U-1).<layer>, the first unit's shortcut_{conv,bn}
    <- .downsample.{0,1}; features_bn <- bn2; embedding_fc <- fc; embeddings <- features."""
    found = [('stem_conv', 'conv1', 'conv'), ('stem_bn', 'bn1', 'bn'), ('stem_prelu', 'prelu', 'prelu')]
    for stage, count in enumerate(UNITS[name], start=1):
        for unit in range(1, count + 1):
            ours, theirs = 'stage%d_unit%d' % (stage, unit), 'layer%d.%d' % (stage, unit - 1)
            found += [('%s_%s' % (ours, layer), '%s.%s' % (theirs, layer), kind) for layer, kind in IBASIC_BLOCK]
            if unit == 1:       # stride 2: the conv1x1 -> BN shortcut
                found += [(ours + '_shortcut_conv', theirs + '.downsample.0', 'conv'),
                          (ours + '_shortcut_bn', theirs + '.downsample.1', 'bn')]
    return found + [('features_bn', 'bn2', 'bn'), ('embedding_fc', 'fc', 'fc'), ('embeddings', 'features', 'bn')]


NETWORKS = {name: Network(name, 'iresnet', entry.shape, get_iresnet, arcface_torch_layers,
                          torch_init='conv_normal_fc_uniform', onednn_extra=entry.onednn_extra)
            for name, entry in catalog.of_family('iresnet').items()}
