"""Initial values of the backbone's parameters.

- "pytorch": every conv and fully-connected weight uniform in +-1/sqrt(fan_in), fan_in = input
  channels per group x kernel area: PyTorch's default (kaiming_uniform_ with a=sqrt(5)),
  which insightface's arcface_torch trains with.
- "xavier": MXNet's Xavier(uniform, avg, magnitude=2), insightface's MXNet default: bound
  sqrt(4 / (fan_in + fan_out)), with MXNet's fan_out = output channels x kernel area, which
  for a depthwise conv of C channels is sqrt((C + 1) / 4) times smaller than the "pytorch"
  bound (4x at 64 channels, 11x at 512).
Either way BatchNorm gammas start at 1, betas at 0, moving means 0, moving variances 1, and
a variable with its own init attribute (the PReLU slopes, 0.25) keeps it.
"""
import mxnet as mx

from .options import BACKBONE_INITS


class FanInUniform(mx.init.Initializer):
    """Weights uniform in +-1/sqrt(fan_in) (PyTorch's default for Conv and Linear)."""

    def _init_weight(self, name, arr):
        fan_in = 1
        for dim in arr.shape[1:]:
            fan_in *= dim
        bound = 1.0 / fan_in ** 0.5
        mx.random.uniform(-bound, bound, shape=arr.shape, out=arr)


def backbone_initializer(kind):
    """The mx.init.Initializer for `kind`, one of BACKBONE_INITS."""
    if kind == "pytorch":
        return FanInUniform()
    if kind == "xavier":
        return mx.init.Xavier(magnitude=2.0)
    raise ValueError(f"backbone_init must be one of {BACKBONE_INITS}, got {kind!r}")
