"""Optimizers of a Partial FC run and their shared learning-rate schedule.

- WarmupMultiStepSchedule, WarmupPolySchedule, WarmupCosineSchedule (make_schedule picks
  one): lr(step), a linear warm-up, then a factor at each step boundary, a polynomial decay
  to 0 at max_update (arcface_torch's default), or a cosine to 0; pure functions of the
  1-based update number, so a resumed run continues them exactly.
- AdamW: torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments) on
  MXNet's fused adamw_update; make_backbone_optimizer builds it or SGD from the config.
- BackboneOptimizer: wraps any mx.optimizer.Optimizer for the data-parallel backbone;
  sum_gradients sums all gradients over the ranks in one fused collective and clips their
  global norm, then Module's update applies the wrapped optimizer.
The bank's optimizer (SGD on the sampled rows) is pfc/bank_optimizer.py's
MemoryBankSGDOptimizer; it shares the momentum forms below.

Momentum forms (MOMENTUM_FORMS), the same while the lr is constant:
- "mxnet" (mx.optimizer.SGD): mom = m mom - lr g; w += mom. The momentum holds lr-scaled
  steps, so after an lr drop it goes on at the old lr for ~1/(1-m) steps while the gradient
  pulls back at the new one: the loss overshoots after the drop.
- "pytorch" (torch.optim.SGD, arcface_torch): buf = m buf + g; w -= lr buf. The backbone keeps
  MXNet's fused update and rescales its momentum by lr(n) / lr(n-1) whenever the lr changes
  (Goyal et al. 2017, "momentum correction"), which is exactly this form; the bank, whose
  rows are updated only when sampled, keeps buf itself (gradient units, no lr inside).
g includes the weight decay: g = grad + wd w.
"""
import bisect
import math
import os

import mxnet as mx

from . import dist
from .config import steps_of
from .options import LR_SCHEDULES, check_momentum_form


class WarmupMultiStepSchedule(mx.lr_scheduler.LRScheduler):
    """lr(n) = base_lr * min(1, n / warmup_steps) * factor ** (number of steps <= n)."""

    def __init__(self, base_lr, warmup_steps=0, steps=(), factor=0.1):
        super().__init__(base_lr=base_lr)
        steps = list(steps)
        if any(b <= a for a, b in zip(steps, steps[1:])) or any(s <= 0 for s in steps):
            raise ValueError(f"lr steps must be positive and increasing, got {steps}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        self.warmup_steps, self.steps, self.factor = warmup_steps, steps, factor

    def __call__(self, num_update):
        lr = self.base_lr * self.factor ** bisect.bisect_right(self.steps, num_update)
        if num_update < self.warmup_steps:
            lr *= num_update / self.warmup_steps
        return lr


class _WarmupDecaySchedule(mx.lr_scheduler.LRScheduler):
    """lr(n) = base_lr * n / warmup_steps during the warm-up, then base_lr * decay(t), t the
    fraction of the steps after the warm-up done: (n - warmup) / (max_update - warmup)."""

    def __init__(self, base_lr, warmup_steps, max_update):
        super().__init__(base_lr=base_lr)
        if not 0 <= warmup_steps < max_update:
            raise ValueError(f"need 0 <= warmup_steps < max_update, got {warmup_steps} and {max_update}")
        self.warmup_steps, self.max_update = warmup_steps, max_update

    def __call__(self, num_update):
        if num_update < self.warmup_steps:
            return self.base_lr * num_update / self.warmup_steps
        done = min(1.0, (num_update - self.warmup_steps) / (self.max_update - self.warmup_steps))
        return self.base_lr * self.decay(done)


class WarmupPolySchedule(_WarmupDecaySchedule):
    """Polynomial decay (1 - t) ** power after the warm-up, 0 at max_update (power 2 as
    arcface_torch's PolyScheduler)."""

    def __init__(self, base_lr, warmup_steps, max_update, power=2.0):
        super().__init__(base_lr, warmup_steps, max_update)
        self.power = power

    def decay(self, done):
        return (1.0 - done) ** self.power


class WarmupCosineSchedule(_WarmupDecaySchedule):
    """Cosine decay (1 + cos(pi t)) / 2 after the warm-up, 0 at max_update."""

    def decay(self, done):
        return 0.5 * (1.0 + math.cos(math.pi * done))


def make_schedule(kind, base_lr, warmup_steps, max_update, steps, factor):
    """The lr schedule `kind` (one of LR_SCHEDULES): 'step' uses steps and factor."""
    if kind == "step":
        return WarmupMultiStepSchedule(base_lr, warmup_steps, steps, factor)
    if kind == "poly":
        return WarmupPolySchedule(base_lr, warmup_steps, max_update)
    if kind == "cosine":
        return WarmupCosineSchedule(base_lr, warmup_steps, max_update)
    raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {kind!r}")


class AdamW(mx.optimizer.Optimizer):
    """torch.optim.AdamW (Loshchilov & Hutter's decoupled weight decay), as arcface_torch's ViT
    recipe trains its backbones. With g the (rescaled) gradient, t the parameter's update count,
    lr the schedule's value (times the parameter's lr_mult) and wd the parameter's decay:
        w -= lr wd w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    the decay as torch applies it (w *= 1 - lr wd), then MXNet's adam_update without decay,
    w -= lr' m / (sqrt(v) + eps'), with lr' = lr sqrt(1 - b2^t) / (1 - b1^t) and eps' = eps
    sqrt(1 - b2^t): the same formula with the bias corrections moved outside the square root.
    (MXNet 1.9's contrib.adamw_update computes the same in one operator at 5x adam_update's time:
    216 against 44 ms for vit_t's 12.9M parameters, one thread.) State per parameter: (m, v),
    float32, zero at the start; a resumed run restarts the counts at its step (set_num_update),
    so t, and with it the corrections, continue exactly."""

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-8, **kwargs):
        super().__init__(**kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def create_state(self, index, weight):
        return (mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype),
                mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype))

    def update(self, index, weight, grad, state):
        self._update_count(index)
        lr, wd = self._get_lr(index), self._get_wd(index)
        t = self._index_update_count[index]
        second = math.sqrt(1.0 - self.beta2 ** t)
        mean, var = state
        if wd:
            weight *= 1.0 - lr * wd
        mx.nd.adam_update(weight, grad, mean, var, lr=lr * second / (1.0 - self.beta1 ** t), beta1=self.beta1,
                          beta2=self.beta2, epsilon=self.epsilon * second, wd=0.0, rescale_grad=self.rescale_grad,
                          clip_gradient=self.clip_gradient if self.clip_gradient else -1.0, out=weight)


def make_backbone_optimizer(cfg, lr, schedule):
    """The backbone's optimizer of a config: cfg.optimizer ('sgd' with cfg.momentum and its
    momentum form, or 'adamw' with cfg.adamw_beta1/2 and cfg.adamw_eps), decaying with cfg.wd,
    starting at `lr` and following `schedule`, wrapped in BackboneOptimizer."""
    common = dict(learning_rate=lr, wd=cfg.wd, rescale_grad=1.0, lr_scheduler=schedule)
    if cfg.optimizer == "adamw":
        inner = AdamW(beta1=cfg.adamw_beta1, beta2=cfg.adamw_beta2, epsilon=cfg.adamw_eps, **common)
    else:
        inner = mx.optimizer.SGD(momentum=cfg.momentum, multi_precision=cfg.fp16, **common)
    return BackboneOptimizer(inner, clip_grad_norm=cfg.clip_grad_norm, momentum_form=cfg.momentum_form,
                             decay_all=cfg.decay_all)


def schedule_of(cfg, lr):
    """The lr schedule of a config (lr_schedule, warmup_steps (a count or a share of the run),
    max_update, lr_steps, lr_factor) starting from `lr`."""
    return make_schedule(cfg.lr_schedule, lr, steps_of(cfg.warmup_steps, cfg.max_update), cfg.max_update,
                         cfg.lr_steps, cfg.lr_factor)


# MXNet's SGD updates 4 parameters per operator call (MXNET_OPTIMIZER_AGGREGATION_SIZE) and its
# multi-tensor kernels take up to 60: a backbone of ~180 parameters in 3 calls instead of 46,
# the same arithmetic per parameter (a setting in the environment is kept).
MULTI_TENSOR_UPDATE = 60


class BackboneOptimizer(mx.optimizer.Optimizer):
    """The data-parallel backbone's optimizer: the wrapped one, applied to gradients summed over
    all ranks and clipped to a global norm (unlike Horovod's DistributedOptimizer, which
    averages and does not clip).

    Each step, sum_gradients(grad_arrays, num_update) runs before Module.update(): gradients are summed,
    not averaged (the step's loss is already the mean over the global batch, so the per-rank
    gradients are partial sums of the exact gradient), all in one fused collective, so every
    rank must own the same parameters in the same order (the same symbol), which data
    parallelism guarantees. With clip_grad_norm > 0 the summed gradients are scaled by
    min(1, clip_grad_norm / global L2 norm), as torch.nn.utils.clip_grad_norm_ does.
    """

    def __init__(self, optimizer, clip_grad_norm=0.0, momentum_form="mxnet", decay_all=False):
        # no super().__init__: every Optimizer attribute is the wrapped one's
        if not clip_grad_norm >= 0:
            raise ValueError(f"clip_grad_norm must be >= 0 (0 = off), got {clip_grad_norm!r}")
        check_momentum_form(momentum_form)
        self._optimizer = optimizer
        if getattr(optimizer, "aggregate_num", 0) > 0 and "MXNET_OPTIMIZER_AGGREGATION_SIZE" not in os.environ:
            optimizer.aggregate_num = MULTI_TENSOR_UPDATE
        self.clip_grad_norm, self.momentum_form, self.decay_all = clip_grad_norm, momentum_form, decay_all
        self.base_rescale_grad = optimizer.rescale_grad
        self.momentum_scale = 1.0       # applied to each state before this step's update ("pytorch")

    def __getattr__(self, item):
        if item == "_optimizer":          # during unpickling, before __init__ ran
            raise AttributeError(item)
        return getattr(self._optimizer, item)

    def set_param_names(self, idx2name):
        """Give the wrapped optimizer the parameter names, so wd_mult/lr_mult defaults
        (no weight decay on biases and BN betas) apply as for a Module-created one; with
        decay_all every parameter decays (arcface_torch's SGD over model.parameters())."""
        self._optimizer.idx2name = dict(idx2name)
        self._optimizer.set_wd_mult(dict.fromkeys(idx2name.values(), 1.0) if self.decay_all else {})
        self._optimizer.set_lr_mult({})

    def lr_at(self, num_update):
        """The lr of update `num_update` (the schedule's, or the fixed lr without one)."""
        inner = self._optimizer
        return inner.lr_scheduler(num_update) if inner.lr_scheduler is not None else inner.lr

    def set_num_update(self, num_update):
        """Restart the wrapped optimizer's update counts at num_update (resume)."""
        inner = self._optimizer
        inner.begin_num_update = inner.num_update = num_update
        for counts in inner._all_index_update_counts.values():
            counts.clear()

    def sum_gradients(self, grad_arrays, num_update):
        """Before update `num_update` (1-based): sum grad_arrays (per parameter, its gradient on
        each of this rank's contexts, as Module's grad_arrays) over the ranks in place; then
        measure their global norm (of the sum over contexts, which Module adds before updating)
        and set the wrapped optimizer's rescale_grad so that the next update()s apply the
        clipped gradients; with the "pytorch" form of SGD, note the momentum correction
        lr(num_update) / lr(num_update - 1) (AdamW's moments hold gradients, not steps). Returns
        the norm."""
        self.momentum_scale = 1.0
        if (self.momentum_form == "pytorch" and isinstance(self._optimizer, mx.optimizer.SGD)
                and self._optimizer.lr_scheduler is not None and num_update > 1):
            lr, previous = self._optimizer.lr_scheduler(num_update), self._optimizer.lr_scheduler(num_update - 1)
            if lr != previous and lr > 0 and previous > 0:
                self.momentum_scale = lr / previous
        arrays = [grad for per_context in grad_arrays for grad in per_context]
        if not arrays:                    # a backbone without parameters (the benchmark's identity)
            return 0.0
        dist.grouped_allreduce_sum_(arrays, "backbone_grads")
        totals = [per_context[0] if len(per_context) == 1 else
                  mx.nd.add_n(*[g.as_in_context(per_context[0].context) for g in per_context])
                  for per_context in grad_arrays]
        squares = mx.nd.multi_sum_sq(*totals, num_arrays=len(totals))
        norm = math.sqrt(float(mx.nd.sum(squares).asscalar()))
        scale = self.clip_grad_norm / norm if self.clip_grad_norm and norm > self.clip_grad_norm else 1.0
        self._optimizer.rescale_grad = self.base_rescale_grad * scale
        return norm

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _correct_momentum(self, index, state):
        if self.momentum_scale == 1.0 or state is None:
            return
        states = state if isinstance(index, (list, tuple)) else [state]
        for one in states:        # SGD: the momentum, or (momentum, fp32 weight) with multi-precision
            momentum = one[0] if isinstance(one, (list, tuple)) else one
            if momentum is not None:
                momentum *= self.momentum_scale

    def update(self, index, weight, grad, state):
        self._correct_momentum(index, state)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        self._correct_momentum(index, state)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)
