"""Size and arithmetic cost of a backbone symbol: backbone_cost(symbol, image_size)."""
import collections

import numpy as np

from .common import attr_ints

# params:        learnable values, the arguments except `data` (a BN gamma counts even with
#                fix_gamma=True, as PyTorch counts a frozen weight among the parameters)
# aux:           BN moving means and variances (auxiliary states; not learnable)
# multiply_adds: multiply-accumulates of the Convolution and FullyConnected layers for one
#                image
# activations:   numbers in the outputs of all layers (not the inputs) for one image, what a
#                training step keeps for the backward pass (sample_fc's memory plan)
Cost = collections.namedtuple('Cost', ['params', 'aux', 'multiply_adds', 'activations'])


def backbone_cost(symbol, image_size):
    """Cost of `symbol` for one 3 x image_size x image_size image.

    multiply_adds sums, over the Convolution layers, output elements x kernel_h x kernel_w x
    input channels / num_group, over the FullyConnected layers, in_features x out_features
    (per token for a ViT's, flatten=False), and over the batch_dots (a ViT's attention), output
    elements x the contracted length. No other layer is counted: not BatchNorm, PReLU, elementwise adds,
    pooling, biases, nor the input normalisation. A PReLU of symbols.common.prelu is built
    from a depthwise 1x1 Convolution whose weight is the slope variable `<prelu>_gamma`;
    that Convolution belongs to the PReLU and is not counted either.
    """
    data_shape = (1, 3, image_size, image_size)
    params, aux = parameter_counts(symbol, image_size)

    internals = symbol.get_internals()
    _, out_shapes, _ = internals.infer_shape(data=data_shape)
    shapes = dict(zip(internals.list_outputs(), out_shapes))
    activations = sum(_size(shape) for name, shape in shapes.items() if name.endswith('_output'))
    multiply_adds = 0
    for layer in internals:
        op = layer.attr('op_name')
        if op == 'Convolution':
            multiply_adds += _conv_multiply_adds(layer, shapes)
        elif op == 'FullyConnected':
            multiply_adds += _fc_multiply_adds(layer, shapes)
        elif op == 'batch_dot':
            multiply_adds += _batch_dot_multiply_adds(layer, shapes)
    return Cost(params=params, aux=aux, multiply_adds=multiply_adds, activations=activations)


def parameter_counts(symbol, image_size):
    """(params, aux) of `symbol` on image_size px inputs: the numbers of its learnable values (the
    arguments except `data`) and of its auxiliary states (BN moving means and variances)."""
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, image_size, image_size))
    params = sum(_size(shape) for name, shape in zip(symbol.list_arguments(), arg_shapes)
                 if name != 'data')
    return params, sum(_size(shape) for shape in aux_shapes)


def network_table(image_size=112, embedding_size=512):
    """Lines `name: P.PPM parameters, G.GG G multiply-adds` for every network of symbols.NETWORKS
    at image_size px and D embedding_size (for --help; about 0.2 s for all of them)."""
    from . import NETWORKS, get_symbol
    lines = []
    for name in NETWORKS:
        cost = backbone_cost(get_symbol(name, embedding_size, image_size), image_size)
        lines.append('%-10s %7.2fM parameters, %6.2f G multiply-adds' % (name, cost.params / 1e6,
                                                                        cost.multiply_adds / 1e9))
    return lines


def _conv_multiply_adds(layer, shapes):
    """output elements x kernel_h x kernel_w x input channels / num_group; 0 for the
    slope Convolution of a PReLU."""
    data, weight = layer.get_children().list_outputs()[:2]
    if weight.endswith('_gamma'):
        return 0
    attrs = layer.list_attr()
    kernel_h, kernel_w = attr_ints(attrs['kernel'])
    groups = int(attrs.get('num_group', 1))
    in_channels = shapes[data][1]
    return _size(shapes[layer.list_outputs()[0]][1:]) * kernel_h * kernel_w \
        * in_channels // groups


def _fc_multiply_adds(layer, shapes):
    """in_features x out_features (the input is flattened, as FullyConnected does)."""
    data = layer.get_children().list_outputs()[0]
    in_features = _size(shapes[data][1:])
    return in_features * int(layer.list_attr()['num_hidden'])


def _batch_dot_multiply_adds(layer, shapes):
    """output elements x the length contracted (the first input's last axis, or its second to
    last when transpose_a)."""
    first = shapes[layer.get_children().list_outputs()[0]]
    inner = first[-2] if layer.list_attr().get('transpose_a', 'False') == 'True' else first[-1]
    return _size(shapes[layer.list_outputs()[0]]) * inner


def _size(shape):
    return int(np.prod(shape, dtype=np.int64))
