"""Layer helpers and argument checks shared by the backbone symbols.

Every helper takes the layer's name; MXNet derives the parameter names from it
(`<name>_weight`, `<name>_gamma`, ...), so the symbol JSON reads like the architecture.
"""
import json
import numbers

import mxnet as mx

BN_EPS = 1e-5        # as PyTorch's BatchNorm default, which insightface's arcface_torch uses
BN_MOMENTUM = 0.9    # MXNet convention: moving = 0.9 * moving + 0.1 * batch
PRELU_INIT = 0.25    # PReLU slope at start (PyTorch's nn.PReLU default)
# A PReLU's nodes, by the suffix each adds to the layer's name (the layer's own node is the add);
# sample_fc/fused_ops.py finds them by these names to fuse them into one operator for training
PRELU_PARTS = {"relu": "_relu", "scaled": "_scaled", "negative": "_negative", "gamma": "_gamma"}
# the names of a ViT attention's first and last node (vit.attention), which fused_ops finds it by
ATTENTION_ENDS = ("_qkv_heads", "_heads_joined")
DOWNSAMPLE = 16      # both backbones halve the resolution four times
DTYPES = ('float32', 'float16')


def attr_ints(text):
    """An MXNet tuple attribute as ints, '(3, 3)' -> (3, 3); a missing one (None) -> None."""
    if text is None:
        return None
    return tuple(int(part) for part in text.strip('()[] ').split(',') if part.strip())


def conv(data, name, num_filter, kernel=3, stride=1, num_group=1, pad=None):
    """Square bias-free convolution; by default padded so that stride 1 keeps the
    spatial size."""
    pad = kernel // 2 if pad is None else pad
    return mx.sym.Convolution(
        data=data, name=name, num_filter=num_filter, num_group=num_group,
        kernel=(kernel, kernel), stride=(stride, stride), pad=(pad, pad), no_bias=True)


def batch_norm(data, name, fix_gamma=False):
    """BatchNorm over channels (axis 1) with the project's eps and momentum."""
    return mx.sym.BatchNorm(data=data, name=name, fix_gamma=fix_gamma,
                            eps=BN_EPS, momentum=BN_MOMENTUM)


def _with_batchnorm_attr(symbol, attr, value, name=None):
    """`symbol` with attribute `attr` set to `value` on its BatchNorms (only the one called
    `name` when given; ValueError when there is none). The parameters are the same."""
    graph = json.loads(symbol.tojson())
    chosen = [node for node in graph['nodes']
              if node['op'] == 'BatchNorm' and (name is None or node['name'] == name)]
    if not chosen:
        raise ValueError('the network has no BatchNorm%s' % ('' if name is None else ' named ' + name))
    for node in chosen:
        node.setdefault('attrs', {})[attr] = value
    return mx.sym.load_json(json.dumps(graph))


def fixes_gamma(attrs):
    """Whether a BatchNorm node with attributes `attrs` holds its scale at 1 (MXNet's default)."""
    return str(attrs.get('fix_gamma', 'True')).lower() in ('true', '1')


def learns_embedding_scale(symbol):
    """Whether `symbol`'s embedding BatchNorm (`embeddings`) learns its scale gamma."""
    node = next(node for node in json.loads(symbol.tojson())['nodes'] if node['name'] == 'embeddings')
    return not fixes_gamma(node.get('attrs', {}))


def with_frozen_batchnorm(symbol):
    """`symbol` with every BatchNorm normalising by its moving statistics in training too, and
    keeping them (use_global_stats): the per-sample affine map a trained network applies at
    inference, so a training step no longer depends on which images share a batch (fine-tuning,
    and the world-size oracle: tests/parallel/test_world_size.py)."""
    return _with_batchnorm_attr(symbol, 'use_global_stats', 'True')


def with_learned_embedding_scale(symbol):
    """`symbol` with its embedding BatchNorm (`embeddings`) learning its scale gamma, as
    arcface_torch's MobileFaceNet's `features` BatchNorm1d does (its IResNets freeze it at 1,
    as this package's networks do). Saved models keep the flag: tools read it from the graph."""
    return _with_batchnorm_attr(symbol, 'fix_gamma', 'False', name='embeddings')


def prelu(data, name, channels):
    """Channel-wise PReLU, relu(x) + slope * min(x, 0), slopes starting at 0.25.

    MXNet 1.9's LeakyReLU(act_type='prelu') is very slow on CPU (measured: ~85% of an mbf
    forward+backward), and so is a broadcast multiply (its backward reduces over N, H, W).
    The slope is therefore applied as a depthwise 1x1 convolution of min(x, 0): the same
    math, with the slopes as the (channels, 1, 1, 1) weight `<name>_gamma`. The variable is
    declared explicitly: MXNet's initializers would otherwise start a `*_gamma` at 1.0.
    symbols/cost.py tells this convolution by its `_gamma` weight and counts no
    multiply-adds for it. This is the form saved models keep (standard operators); training
    on the CPU runs it as one operator (sample_fc/fused_ops.py, 9x faster).
    """
    slope = mx.sym.Variable(name + PRELU_PARTS['gamma'], shape=(channels, 1, 1, 1),
                            init=mx.init.Constant(PRELU_INIT))
    negative = mx.sym.clip(data, -float('inf'), 0.0, name=name + PRELU_PARTS['negative'])
    scaled = mx.sym.Convolution(data=negative, weight=slope, num_filter=channels,
                                num_group=channels, kernel=(1, 1), no_bias=True,
                                name=name + PRELU_PARTS['scaled'])
    return mx.sym.elemwise_add(mx.sym.relu(data, name=name + PRELU_PARTS['relu']), scaled, name=name)


def conv_bn(data, name, num_filter, kernel=3, stride=1, num_group=1, pad=None, act=True):
    """conv -> BN (-> PReLU): layers `<name>_conv`, `<name>_bn`, `<name>_prelu`."""
    body = conv(data, name + '_conv', num_filter, kernel, stride, num_group, pad)
    body = batch_norm(body, name + '_bn')
    return prelu(body, name + '_prelu', num_filter) if act else body


def embedding_head(features, embedding_size, dtype, dropout, fc_bias):
    """Dropout -> Flatten -> (cast to fp32) -> FullyConnected -> BN named 'embeddings'.

    The final BatchNorm has no learnable scale (fix_gamma=True), like insightface's
    `features` BatchNorm1d whose weight is frozen at 1.
    """
    body = mx.sym.Dropout(data=features, p=dropout, name='features_dropout')
    body = mx.sym.Flatten(data=body, name='features_flatten')
    if dtype == 'float16':
        # the embedding layer and everything after it (margin, softmax) stay in fp32
        body = mx.sym.Cast(data=body, dtype='float32', name='features_fp32')
    body = mx.sym.FullyConnected(data=body, num_hidden=embedding_size, no_bias=not fc_bias,
                                 name='embedding_fc')
    return batch_norm(body, 'embeddings', fix_gamma=True)


def input_data(dtype):
    """The `data` variable (N, 3, H, W) of raw RGB pixels 0..255, normalised in the graph
    to (x - 127.5) / 128 (as insightface's MXNet models: exported models take raw pixels),
    then cast to float16 for an fp16 backbone."""
    data = mx.sym.Variable('data')
    data = (data - 127.5) * 0.0078125
    if dtype == 'float16':
        data = mx.sym.Cast(data=data, dtype='float16', name='data_fp16')
    return data


def check_args(embedding_size, image_size, dtype, dropout):
    """Raise ValueError naming the bad value and what is allowed; return the final
    feature-map side (image_size // 16)."""
    if not _is_int(embedding_size) or embedding_size <= 0:
        raise ValueError('embedding_size must be a positive int, got %r' % (embedding_size,))
    if not _is_int(image_size) or image_size <= 0 or image_size % DOWNSAMPLE:
        raise ValueError('image_size must be a positive multiple of %d (e.g. 112 or 64), '
                         'got %r' % (DOWNSAMPLE, image_size))
    if dtype not in DTYPES:
        raise ValueError('dtype must be one of %s, got %r' % (', '.join(DTYPES), dtype))
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) \
            or not 0.0 <= dropout < 1.0:
        raise ValueError('dropout must be a probability in [0, 1), got %r' % (dropout,))
    return int(image_size) // DOWNSAMPLE


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)
