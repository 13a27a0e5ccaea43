"""Initial values of the backbone's parameters.

- "pytorch": every conv and fully-connected weight uniform in +-1/sqrt(fan_in), fan_in = input
  channels per group x kernel area: PyTorch's default (kaiming_uniform_ with a=sqrt(5)), which
  arcface_torch's networks replace with their own (below) in all but the IResNet's FC.
- "arcface_torch": what arcface_torch's own networks set in their constructors. MobileFaceNet
  (mbf, mbf_small, mbf_large): every conv and the embedding FC weight normal with std
  sqrt(2 / fan_out), fan_out = output channels x kernel area (kaiming_normal_, mode fan_out,
  relu): a depthwise conv of C channels starts with a std sqrt(C / 6) times smaller than under
  "pytorch" (4.6x at 128 channels). IResNet (r18..r200): every conv weight normal with std 0.1, the
  embedding FC PyTorch's default (its bias starts at 0 here, U(+-1/sqrt(fan_in)) there: the
  BatchNorm after it removes a constant in training). ViT (vit_*): every Linear weight normal
  with std 0.02, the position embedding too, the patch convolution PyTorch's default. The default
  (the key table): on 1,000 glyph identities mbf ended 0.9178 with it and 0.9094 with "pytorch" (three
  seeds each, BENCHMARKS.md).
- "xavier": MXNet's Xavier(uniform, avg, magnitude=2), insightface's MXNet default: bound
  sqrt(4 / (fan_in + fan_out)), with MXNet's fan_out = output channels x kernel area, which
  for a depthwise conv of C channels is sqrt((C + 1) / 4) times smaller than the "pytorch"
  bound (4x at 64 channels, 11x at 512).
Either way BatchNorm gammas start at 1, betas at 0, moving means 0, moving variances 1, and
a variable with its own init attribute (the PReLU slopes, 0.25) keeps it.
"""
import mxnet as mx

from . import symbols
from .options import BACKBONE_INITS

IRESNET_CONV_STD = 0.1      # arcface_torch iresnet.py: nn.init.normal_(conv.weight, 0, 0.1)
VIT_STD = 0.02              # arcface_torch vit.py: trunc_normal_(linear.weight, std=.02), and the position embedding


class FanInUniform(mx.init.Initializer):
    """Weights uniform in +-1/sqrt(fan_in) (PyTorch's default for Conv and Linear)."""

    def _init_weight(self, name, arr):
        fan_in = 1
        for dim in arr.shape[1:]:
            fan_in *= dim
        bound = 1.0 / fan_in ** 0.5
        mx.random.uniform(-bound, bound, shape=arr.shape, out=arr)


class FanOutNormal(mx.init.Initializer):
    """Weights normal with std sqrt(2 / fan_out), fan_out = shape[0] x kernel area (PyTorch's
    kaiming_normal_(mode="fan_out", nonlinearity="relu"); for an FC weight, its outputs)."""

    def _init_weight(self, name, arr):
        fan_out = arr.shape[0]
        for dim in arr.shape[2:]:
            fan_out *= dim
        mx.random.normal(0.0, (2.0 / fan_out) ** 0.5, shape=arr.shape, out=arr)


class VitNormal(FanInUniform):
    """arcface_torch's ViT: Linear weights (2-D) normal with std 0.02 (timm's trunc_normal_ cuts
    at +-2, a hundred stds: the same draw), the patch convolution (4-D) PyTorch's default."""

    def _init_weight(self, name, arr):
        if len(arr.shape) == 2:
            mx.random.normal(0.0, VIT_STD, shape=arr.shape, out=arr)
        else:
            super()._init_weight(name, arr)


class ConvNormalFcUniform(FanInUniform):
    """Conv weights (4-D) normal with a fixed std, FC weights (2-D) as FanInUniform."""

    def __init__(self, conv_std):
        super().__init__(conv_std=conv_std)
        self.conv_std = conv_std

    def _init_weight(self, name, arr):
        if len(arr.shape) == 4:
            mx.random.normal(0.0, self.conv_std, shape=arr.shape, out=arr)
        else:
            super()._init_weight(name, arr)


def backbone_initializer(kind, network=None):
    """The mx.init.Initializer for `kind`, one of BACKBONE_INITS; "arcface_torch" depends on the
    `network` (one of symbols.NETWORKS)."""
    if kind == "pytorch":
        return FanInUniform()
    if kind == "arcface_torch":
        torch_init = symbols.network(network).torch_init      # UnknownNetwork for any other name
        return {"conv_normal_fc_uniform": ConvNormalFcUniform(IRESNET_CONV_STD), "vit_trunc_normal": VitNormal(),
                "fan_out_normal": FanOutNormal()}[torch_init]
    if kind == "xavier":
        return mx.init.Xavier(magnitude=2.0)
    raise ValueError(f"backbone_init must be one of {BACKBONE_INITS}, got {kind!r}")


def initial_params(symbol, image_size, initializer):
    """(arg_params, aux_params) of `symbol` as Module.init_params draws them (every parameter
    in name order from one random stream): the whole backbone's, for a run that trains it
    in two parts (pfc/global_tail.py), so that its start is the same as in one."""
    module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", (1, 3, image_size, image_size))], for_training=False)
    module.init_params(initializer=initializer)
    return module.get_params()
