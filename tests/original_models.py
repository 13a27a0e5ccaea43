"""Backbones as the original MXNet toolkit (insightface's recognition/symbol/fresnet.py,
unit version 3, output E) names them, for tests of models from elsewhere: conv0/bn0/relu0,
stage<i>_unit<j>_bn1/conv1/bn2/relu1/conv2/bn3 (+ _conv1sc/_sc), bn1, pre_fc1, fc1; PReLU as
LeakyReLU(act_type='prelu'), BatchNorm eps 2e-5. The architecture is sample_fc's IResNet."""
import mxnet as mx
import numpy as np

BN_EPS = 2e-5


def _bn(data, name, fix_gamma=False):
    return mx.sym.BatchNorm(data=data, name=name, fix_gamma=fix_gamma, eps=BN_EPS, momentum=0.9)


def _conv(data, name, channels, kernel, stride):
    return mx.sym.Convolution(data=data, name=name, num_filter=channels, kernel=(kernel, kernel),
                              stride=(stride, stride), pad=(kernel // 2, kernel // 2), no_bias=True)


def original_iresnet(units, embedding_size, normalizes_input=True, with_training_head=0):
    """The fresnet symbol with `units` per stage; output fc1 (or, with_training_head=N, the
    symbol of training: fc1 plus a softmax over N classes, fc7, as the original saved it)."""
    data = mx.sym.Variable("data")
    body = (data - 127.5) * 0.0078125 if normalizes_input else data
    body = mx.sym.LeakyReLU(_bn(_conv(body, "conv0", 64, 3, 1), "bn0"), act_type="prelu", name="relu0")
    in_channels = 64
    for stage, (channels, count) in enumerate(zip((64, 128, 256, 512), units), start=1):
        for unit in range(1, count + 1):
            name, stride = f"stage{stage}_unit{unit}", 2 if unit == 1 else 1
            branch = _conv(_bn(body, name + "_bn1"), name + "_conv1", channels, 3, 1)
            branch = mx.sym.LeakyReLU(_bn(branch, name + "_bn2"), act_type="prelu", name=name + "_relu1")
            branch = _bn(_conv(branch, name + "_conv2", channels, 3, stride), name + "_bn3")
            shortcut = body if stride == 1 and in_channels == channels else \
                _bn(_conv(body, name + "_conv1sc", channels, 1, stride), name + "_sc")
            body, in_channels = branch + shortcut, channels
    body = mx.sym.Dropout(_bn(body, "bn1"), p=0.4)
    fc1 = _bn(mx.sym.FullyConnected(body, num_hidden=embedding_size, name="pre_fc1"), "fc1", fix_gamma=True)
    if not with_training_head:
        return fc1
    fc7 = mx.sym.FullyConnected(fc1, num_hidden=with_training_head, name="fc7")
    return mx.sym.Group([mx.sym.BlockGrad(fc1), mx.sym.SoftmaxOutput(fc7, name="softmax")])


def save_original(prefix, units, embedding_size, image_size, seed=0, **kwargs):
    """Save a random original-naming model at `prefix`, epoch 1 (random BN statistics, so every
    parameter matters); returns (symbol, arg_params, aux_params)."""
    symbol = original_iresnet(units, embedding_size, **kwargs)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, image_size, image_size),
                                                   **({"softmax_label": (1,)} if kwargs.get("with_training_head") else {}))
    rng = np.random.default_rng(seed)
    arg_params = {}
    for name, shape in zip(symbol.list_arguments(), arg_shapes):
        if name in ("data", "softmax_label"):
            continue
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        value = rng.normal(0, np.sqrt(2.0 / fan_in), shape) if name.endswith("_weight") else \
            rng.uniform(0.1, 0.4, shape) if name.startswith("relu") or "_relu" in name else \
            rng.uniform(0.8, 1.2, shape) if name.endswith("_gamma") else rng.normal(0, 0.1, shape)
        arg_params[name] = mx.nd.array(value)
    aux_params = {name: mx.nd.array(rng.uniform(0.5, 1.5, shape) if name.endswith("var") else rng.normal(0, 0.1, shape))
                  for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes)}
    mx.model.save_checkpoint(prefix, 1, symbol, arg_params, aux_params)
    return symbol, arg_params, aux_params


def forward(symbol, arg_params, aux_params, pixels):
    """symbol's first output for float32 NCHW `pixels`, inference mode (a plain MXNet Module)."""
    module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", pixels.shape)], for_training=False)
    module.set_params(arg_params, aux_params, allow_missing=False, allow_extra=True)
    module.forward(mx.io.DataBatch([mx.nd.array(pixels)]), is_train=False)
    return module.get_outputs()[0].asnumpy()
