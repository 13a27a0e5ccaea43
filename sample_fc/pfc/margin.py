"""Combined angular margin: target logit s * psi(c), psi(c) = cos(m1 * arccos(c) + m2) - m3.

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

import mxnet as mx
import numpy as np

EPS = 1e-6


class CombinedMargin:
    """The margin (m1, m2, m3) and scale s of the target logit."""

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

    def psi_and_derivative(self, cos_target):
        """(psi(c), d psi / dc) for a vector of target cosines (an NDArray or a NumPy array;
        the results are of the same kind)."""
        ops = np if isinstance(cos_target, np.ndarray) else mx.nd
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
    """The margin of update n when the margins grow in over `steps` updates: m2 and m3 times
    a = min(1, n / steps), m1 from 1 towards its value (1 + (m1 - 1) a), s fixed. At a = 0 the
    loss is the plain normalised softmax, which trains from scratch where a full ArcFace
    margin (0.5 rad at s = 64) stalls; a pure function of n (exact resume). steps = 0: the
    target margin from the first update."""

    def __init__(self, margin, steps=0):
        if not (isinstance(steps, int) and steps >= 0):
            raise ValueError(f"margin warm-up needs steps >= 0 (0 = none), got {steps!r}")
        self.target, self.steps = margin, steps

    def __call__(self, num_update):
        a = min(1.0, num_update / self.steps) if self.steps else 1.0
        if a == 1.0:
            return self.target
        t = self.target
        return CombinedMargin(1.0 + (t.m1 - 1.0) * a, t.m2 * a, t.m3 * a, t.s)
