"""The bank's optimizer: SGD with momentum and weight decay on the sampled rows of a shard,
the one formula both head kernels apply. Its momentum forms are the backbone's
(sample_fc/optimizers.py: "mxnet" and "pytorch")."""
import mxnet as mx
import numpy as np

from ..options import check_momentum_form


class MemoryBankSGDOptimizer:
    """SGD with momentum and weight decay for the sampled rows of the memory bank: the one
    formula both head kernels apply (rows as NDArrays or NumPy arrays, updated in place).

    g = grad + wd * weight, lr = lr_schedule(num_update), (a, b) = step_scales(num_update):
        mom = momentum * mom - a * g;  weight += b * mom
    "mxnet":   (a, b) = (lr, 1): MXNet's sgd_mom_update (the momentum holds lr-scaled steps);
    "pytorch": (a, b) = (1, lr): torch.optim.SGD with mom = -buf (the momentum holds gradients).
    A bank without momentum (bank_momentum=none) passes momentum rows None: plain SGD at the
    step momentum SGD takes once its momentum has built up, weight -= b * a * g / (1 - momentum)
    (with momentum 0: the formula above, bit for bit).
    """

    def __init__(self, lr_schedule, momentum=0.9, wd=5e-4, momentum_form="mxnet"):
        check_momentum_form(momentum_form)
        self.lr_schedule, self.momentum, self.wd = lr_schedule, momentum, wd
        self.momentum_form = momentum_form

    def step_scales(self, num_update):
        """(a, b) of update `num_update` (1-based): a scales the step into the momentum, b the
        momentum into the weights."""
        lr = self.lr_schedule(num_update)
        return (lr, 1.0) if self.momentum_form == "mxnet" else (1.0, lr)

    def apply(self, weight_rows, momentum_rows, scaled_step, weight_scale, scratch=None):
        """mom = momentum * mom - scaled_step; weight += weight_scale * mom, in place, where
        scaled_step = a * (grad + wd * weight); momentum_rows None (no momentum stored):
        weight -= weight_scale * scaled_step / (1 - momentum). `scratch` (NumPy, the rows' shape) avoids a
        temporary for weight_scale * mom."""
        if momentum_rows is None:
            self._apply_without_momentum(weight_rows, scaled_step, weight_scale / (1.0 - self.momentum), scratch)
            return
        momentum_rows *= self.momentum
        momentum_rows -= scaled_step
        if weight_scale == 1.0:
            weight_rows += momentum_rows
        elif scratch is not None:
            weight_rows += np.multiply(momentum_rows, weight_scale, out=scratch)
        else:
            weight_rows += momentum_rows * weight_scale

    @staticmethod
    def _apply_without_momentum(weight_rows, scaled_step, weight_scale, scratch=None):
        """Plain SGD: weight -= weight_scale * scaled_step (what momentum 0 gives: mom = -scaled_step)."""
        if weight_scale == 1.0:
            weight_rows -= scaled_step
        elif scratch is not None:
            weight_rows -= np.multiply(scaled_step, weight_scale, out=scratch)
        else:
            weight_rows -= scaled_step * weight_scale

    def decay(self, decay_scales=None):
        """The weight decay of each updated row: wd, or wd * decay_scales ((K,) NumPy, the
        weight-decay correction of a sample: sampler.sampled_decay_scales) as a (K,) array."""
        return self.wd if decay_scales is None else self.wd * np.asarray(decay_scales, dtype=np.float32)

    def update(self, weight_rows, momentum_rows, grad_rows, num_update, decay_scales=None):
        """Update weight_rows and momentum_rows (None: no momentum) in place with their gradient
        grad_rows; each row decays with wd, times its entry of decay_scales if given."""
        step_scale, weight_scale = self.step_scales(num_update)
        decay = self.decay(decay_scales)
        if decay_scales is not None:     # one factor per row
            decay = decay.reshape(-1, 1)
            if isinstance(weight_rows, mx.nd.NDArray):
                decay = mx.nd.array(decay, ctx=weight_rows.context, dtype=weight_rows.dtype)
        self.apply(weight_rows, momentum_rows, (grad_rows + decay * weight_rows) * step_scale, weight_scale)
