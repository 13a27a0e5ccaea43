"""The margins: how a row's logits are made from its cosines. One interface, read by both head
kernels (device_head.py on any context, head.py's HostHead in NumPy) and checked against PyTorch:

    margin.s                        the scale of every logit
    margin.target(c)                (psi(c), psi'(c)) of the rows' target cosines: logit s * psi(c)
    margin.touches_negatives        False: every other logit is s * c. True: the kernels gather every
                                    row's target cosine on every rank (one more small allreduce) and
    margin.negatives(cos, c_t)      gives (v, v') of each entry of `cos` (rows' target cosines c_t):
                                    logit s * v; the kernels use it for every entry but the target
    margin.observe(c_t)             told each step's target cosines (all rows) before `negatives`
    margin.at(a)                    the margin at warm-up fraction a in [0, 1] (MarginWarmup)
    margin.state_dict() / load_state_dict(d)   what a checkpoint keeps of it ({} when nothing)

A margin word (the config's loss_margin) is a Kind in KINDS: its class, the keys it fixes and its
published settings (the loss presets, which sample_fc/config reads here: this file imports MXNet only
when an NDArray reaches it). A new margin is its class and its Kind here, and its test.

CombinedMargin: target logit s * psi(c), psi(c) = cos(m1 * arccos(c) + m2) - m3.
ArcFace is (m1, m2, m3) = (1, 0.5, 0), CosFace (1, 0, 0.4), SphereFace-like m1 > 1.
Only the target entry of each row gets the margin; the others stay s * c.

Two numerical rules keep training finite:
- c is clamped to [-1 + EPS, 1 - EPS] before arccos, so d psi / dc = m1 sin(m1 theta + m2) /
  sin(theta) has sin(theta) >= ~1.4e-3 and stays finite at c = +-1;
- past theta* = (pi - m2) / m1, where m1 theta + m2 would exceed pi and cos(.) would turn
  back up, psi continues as c - cos(theta*) - 1 - m3: continuous at theta*, decreasing in
  theta, slope 1. So psi is monotone in theta over the whole [0, pi].
The formula is written once for both head kernels: it takes and returns NDArrays on any
context (the device kernel) or NumPy arrays (the host kernel), computing in the input's dtype.
"""
import math
from typing import Callable, NamedTuple

import numpy as np

EPS = 1e-6


def array_ops(array):
    """NumPy for a NumPy array, mx.nd for an NDArray (MXNet imported only then)."""
    if isinstance(array, np.ndarray):
        return np
    import mxnet as mx
    return mx.nd


class CombinedMargin:
    """The margin (m1, m2, m3) and scale s of the target logit."""
    touches_negatives = False

    def __init__(self, m1=1.0, m2=0.5, m3=0.0, s=64.0):
        for name, value in (("m1", m1), ("m2", m2), ("m3", m3), ("s", s)):
            if not math.isfinite(value):
                raise ValueError(f"margin {name} must be finite, got {value}")
        if m1 <= 0 or m2 < 0 or s <= 0:
            raise ValueError(f"margin needs m1 > 0, m2 >= 0, s > 0; got m1={m1}, m2={m2}, s={s}")
        self.m1, self.m2, self.m3, self.s = float(m1), float(m2), float(m3), float(s)
        self.cos_only = self.m1 == 1.0 and self.m2 == 0.0      # psi(c) = c - m3 exactly
        self.theta_star = (math.pi - self.m2) / self.m1         # where m1 theta + m2 = pi
        self.cos_star = math.cos(self.theta_star) if self.theta_star < math.pi else -1.0

    def __repr__(self):
        return f"CombinedMargin(m1={self.m1}, m2={self.m2}, m3={self.m3}, s={self.s})"

    def psi(self, cos_target):
        """psi(c) for the target cosines (without the scale s)."""
        return self.psi_and_derivative(cos_target)[0]

    def target(self, cos_target):
        return self.psi_and_derivative(cos_target)

    def at(self, a):
        """m2 and m3 times a, m1 from 1 towards its value (1 + (m1 - 1) a), s fixed."""
        return CombinedMargin(1.0 + (self.m1 - 1.0) * a, self.m2 * a, self.m3 * a, self.s)

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def psi_and_derivative(self, cos_target):
        """(psi(c), d psi / dc) for a vector of target cosines (an NDArray or a NumPy array;
        the results are of the same kind)."""
        ops = array_ops(cos_target)
        if self.cos_only:
            return cos_target - self.m3, ops.ones_like(cos_target)
        c = ops.clip(cos_target, -1.0 + EPS, 1.0 - EPS)
        theta = ops.arccos(c)
        angle = theta * self.m1 + self.m2
        main_value = ops.cos(angle) - self.m3
        main_slope = ops.sin(angle) * self.m1 / ops.sqrt(1.0 - c * c)
        if self.theta_star >= math.pi:          # the continuation is never reached
            return main_value, main_slope
        past = angle > math.pi
        tail_value = cos_target - (self.cos_star + 1.0 + self.m3)
        value = ops.where(past, tail_value, main_value)
        slope = ops.where(past, ops.ones_like(c), main_slope)
        return value, slope


class MarginWarmup:
    """The margin of update n when the margins grow in over `steps` updates: margin.at(a),
    a = min(1, n / steps) (CombinedMargin: m2 and m3 times a, m1 from 1 towards its value, s fixed). At a = 0 the
    loss is the plain normalised softmax, which trains from scratch where a full ArcFace
    margin (0.5 rad at s = 64) stalls; a pure function of n (exact resume). steps = 0: the
    target margin from the first update."""

    def __init__(self, margin, steps=0):
        if not (isinstance(steps, int) and steps >= 0):
            raise ValueError(f"margin warm-up needs steps >= 0 (0 = none), got {steps!r}")
        self.target, self.steps = margin, steps

    def __call__(self, num_update):
        a = min(1.0, num_update / self.steps) if self.steps else 1.0
        return self.target if a == 1.0 else self.target.at(a)


class CurricularState:
    """CurricularFace's t: a running mean of the batch's target cosines (shared by the margins
    of every warm-up fraction; the same on every rank: it sees the global batch)."""

    def __init__(self, t=0.0):
        self.t = float(t)


class CurricularFace:
    """CurricularFace (Huang et al., CVPR 2020): the target logit is ArcFace's, s cos(theta + m)
    (past theta = pi - m, s (c - m sin(pi - m)), as its code continues it), and a negative whose
    cosine c exceeds its row's cos(theta_y + m) (a hard one) becomes s c (t + c), t a running mean
    of the target cosines (t <- 0.01 mean + 0.99 t each step, before the step's logits; no
    gradient through t or the choice of hard negatives): d logit / dc = s (t + 2c) there. The mean
    is over the global batch (the original takes each GPU's batch)."""
    touches_negatives = True
    T_MOMENTUM = 0.01

    def __init__(self, m=0.5, s=64.0, state=None):
        for name, value in (("m", m), ("s", s)):
            if not math.isfinite(value):
                raise ValueError(f"margin {name} must be finite, got {value}")
        if not (0 <= m < math.pi) or s <= 0:
            raise ValueError(f"CurricularFace needs 0 <= m < pi and s > 0; got m={m}, s={s}")
        self.m, self.s = float(m), float(s)
        self.state = state or CurricularState()
        self.threshold = math.cos(math.pi - self.m)        # theta_y + m reaches pi below this cosine
        self.fallback = math.sin(math.pi - self.m) * self.m

    def __repr__(self):
        return f"CurricularFace(m={self.m}, s={self.s}, t={self.state.t})"

    def _shifted(self, c):
        """cos(theta + m) of clamped cosines and its derivative in c (any array kind)."""
        ops = array_ops(c)
        c = ops.clip(c, -1.0 + EPS, 1.0 - EPS)
        sine = ops.sqrt(1.0 - c * c)
        value = c * math.cos(self.m) - sine * math.sin(self.m)
        return value, math.cos(self.m) + c * (math.sin(self.m) / sine), ops

    def target(self, cos_target):
        value, slope, ops = self._shifted(cos_target)
        easy = cos_target > self.threshold
        return (ops.where(easy, value, cos_target - self.fallback),
                ops.where(easy, slope, ops.ones_like(cos_target)))

    def observe(self, cos_target):
        """t <- 0.01 mean(target cosines, clamped to [-1, 1]) + 0.99 t (the mean in float64 from
        either kernel's array, so both kernels keep the same t)."""
        values = cos_target if isinstance(cos_target, np.ndarray) else cos_target.asnumpy()
        mean = float(np.mean(np.clip(values, -1.0, 1.0), dtype=np.float64))
        self.state.t = self.T_MOMENTUM * mean + (1.0 - self.T_MOMENTUM) * self.state.t

    def negatives(self, cosine, cos_target):
        """(v, v') of every entry of `cosine` (N, K), its rows' target cosines `cos_target` (N,):
        c (t + c) and t + 2c where c > cos(theta_y + m), else c and 1."""
        shifted = self._shifted(cos_target)[0]
        if isinstance(cosine, np.ndarray):
            hard = cosine > shifted[:, None]
            t = np.float32(self.state.t)
            return np.where(hard, cosine * (t + cosine), cosine), np.where(hard, t + 2 * cosine, np.float32(1.0))
        nd = array_ops(cosine)
        hard = nd.broadcast_greater(cosine, shifted.reshape((-1, 1)))
        t = self.state.t
        return (nd.where(hard, cosine * (cosine + t), cosine), nd.where(hard, cosine * 2 + t, nd.ones_like(cosine)))

    def at(self, a):
        return CurricularFace(self.m * a, self.s, self.state)

    def state_dict(self):
        return {"t": self.state.t}

    def load_state_dict(self, state):
        self.state.t = float(state.get("t", 0.0))


class Kind(NamedTuple):
    """A margin word: what it builds, the keys it takes one value of, its published settings."""
    build: Callable              # (m1, m2, m3, s) -> the margin
    fixed: dict                  # {config key: the only value this margin takes}, why in `fixed_reason`
    fixed_reason: str
    published: dict              # loss preset name -> its loss_m1..m3 (config presets: LOSS_PRESETS)


# The published margins. Not the scale s: both papers use s = 64 for their ~10^4-10^5 identities,
# which the base config holds; a small set trains at a smaller s (the demo preset's 32), as the
# scale a softmax over C classes needs grows with log C.
KINDS = {
    "combined": Kind(CombinedMargin, {}, "", {
        "arcface": {"loss_m1": 1.0, "loss_m2": 0.5, "loss_m3": 0.0},     # Deng et al., CVPR 2019: 0.5 rad angular
        "cosface": {"loss_m1": 1.0, "loss_m2": 0.0, "loss_m3": 0.4},     # Wang et al., CVPR 2018: 0.4 on the cosine
    }),
    "curricularface": Kind(lambda m1, m2, m3, s: CurricularFace(m2, s), {"loss_m1": 1.0, "loss_m3": 0.0},
                           "its margin is loss_m2", {
        "curricularface": {"loss_m1": 1.0, "loss_m2": 0.5, "loss_m3": 0.0},   # Huang et al., CVPR 2020: m = 0.5 rad
    }),
}
MARGINS = tuple(KINDS)             # the config's loss_margin words


def loss_presets():
    """{loss preset name: its keys} of every margin word's published settings, loss_margin included."""
    return {name: {"loss_margin": word, **keys}
            for word, kind in KINDS.items() for name, keys in kind.published.items()}


def margin_key_problem(word, values):
    """The one rule of which margin keys a margin takes: None, or (key, value, what it must be) for
    the first of its fixed keys whose value in `values` (a config) differs. config.check_config
    and make_margin say it."""
    kind = KINDS.get(word)
    for key, needed in (kind.fixed.items() if kind else ()):
        if values[key] != needed:
            return key, values[key], f"{needed:g} with loss_margin={word} ({kind.fixed_reason})"
    return None


def make_margin(kind, m1=1.0, m2=0.5, m3=0.0, s=64.0):
    """The margin of word `kind` (one of MARGINS) from the config's loss_m1..m3 and loss_s;
    ValueError for another word or a key the margin does not take (margin_key_problem)."""
    if kind not in KINDS:
        raise ValueError(f"loss_margin must be one of {MARGINS}, got {kind!r}")
    problem = margin_key_problem(kind, {"loss_m1": m1, "loss_m2": m2, "loss_m3": m3, "loss_s": s})
    if problem:
        raise ValueError(f"{problem[0]}={problem[1]:g}; expected {problem[2]}")
    return KINDS[kind].build(m1, m2, m3, s)
