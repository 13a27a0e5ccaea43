"""The sampling regime of a run: how often each center is drawn as a negative per visit of its
own class, q*K/B (q the sample ratio, K the classes, B the global batch), and what that has cost
where it was measured; the ratio that reaches the safe level and its step-time cost.

A class is in the batch B/K times per step on average and its center is drawn as a negative q
times per step, so between two visits of its own class a center is pushed by negatives q*K/B
times. Where Partial FC matches the full softmax that number is 30-60; below it a short run
loses accuracy (MEASURED). A pure function of the run's shape: train.py logs it at start-up,
tools.plan prints it.
"""
import math
from dataclasses import dataclass

from .sampler import most_rows_scored, num_sample_for

SAFE_DRAWS_PER_VISIT = 35.0     # Glint360K at ratio 0.1, B = 1024: parity with ratio 1.0 (IJB-C 97.3 both)
MEASURED = (                    # (q*K/B, what it cost against ratio 1.0), the lowest first
    (3.9, "6.4 points at 1,000 steps on 5,000 real-image identities (two seeds, BENCHMARKS.md 'When to "
          "sample'; 1.9 points on the demo's synthetic kind)"),
    (5.8, "3.9 points at 1,000 steps on 7,400 real-image identities (one seed)"),
    (7.8, "2.4 points at 1,000 steps on 5,000 real-image identities (two seeds)"),
    (19.5, "0.9 points at 1,000 steps on 5,000 real-image identities (two seeds) and on synthetic ones "
           "(none with sample_wd_correction)"),
    (30.0, "0.64 MFR points on WebFace12M (arcface_torch, ratio 0.05)"),
    (35.0, "nothing: Glint360K at ratio 0.1 (IJB-C 97.3 at 0.1 and 1.0)"),
    (60.0, "nothing: WebFace12M at ratio 0.1"),
)


def nearest_measured(points, value):
    """The (x, ...) point of a measured table nearest `value` on a log scale (x and value > 0; a
    value of 0 counts as 1e-9): the table a start-up line quotes beside its choice."""
    return min(points, key=lambda point: abs(math.log(point[0]) - math.log(max(value, 1e-9))))


def draws_per_visit(sample_ratio, num_classes, global_batch):
    """q*K/B: how many times a center is drawn as a negative per visit of its own class."""
    return sample_ratio * num_classes / global_batch


def safe_ratio(num_classes, global_batch):
    """The smallest ratio whose q*K/B reaches SAFE_DRAWS_PER_VISIT (1.0 where none does)."""
    return min(1.0, math.ceil(100 * SAFE_DRAWS_PER_VISIT * global_batch / num_classes) / 100)


def head_flops(sampled_rows, global_batch, embedding_size):
    """Floating-point operations of one rank's head step: three GEMMs of B x D x K."""
    return 3 * 2 * global_batch * embedding_size * sampled_rows


def backbone_flops(multiply_adds_per_image, batch_size):
    """Floating-point operations of one rank's backbone step: forward and backward (~2x)."""
    return 3 * 2 * multiply_adds_per_image * batch_size


@dataclass(frozen=True)
class Regime:
    sample_ratio: float
    draws: float                # q*K/B
    sampled_per_rank: int       # centers scored per step per worker (before positives beyond it)
    measured: str               # the nearest measured point's cost
    safe_ratio: float
    step_cost: float            # the step's time at safe_ratio over its time at sample_ratio (FLOP model)

    @property
    def lossy(self):
        return self.sample_ratio < 1.0 and self.draws < SAFE_DRAWS_PER_VISIT

    def line(self):
        """The regime in one line (the start-up log, tools.plan)."""
        return (f"sampling: ratio {self.sample_ratio:g}, {self.sampled_per_rank:,} centers scored per step per "
                f"worker (more when the batch's positives are more); each center is drawn as a negative "
                f"{self.draws:.1f} times per visit of its own class "
                f"(q*K/B; from ~{SAFE_DRAWS_PER_VISIT:g} on, sampling matched ratio 1.0 where measured; "
                f"{self.measured})")

    def warning(self):
        """One line when the regime is in the measured lossy range, else None."""
        if not self.lossy:
            return None
        return (f"sample_ratio={self.sample_ratio:g} is where sampling has cost accuracy (q*K/B {self.draws:.1f} < "
                f"{SAFE_DRAWS_PER_VISIT:g}, see the sampling line); sample_ratio={self.safe_ratio:g} reaches "
                f"{SAFE_DRAWS_PER_VISIT:g} at about {100 * (self.step_cost - 1):+.0f}% step time (FLOP model of "
                f"head and backbone)")


def regime(sample_ratio, num_classes, world, batch_size, embedding_size, multiply_adds_per_image):
    """The Regime of a run: `world` workers of `batch_size` images, `num_classes` centers of
    `embedding_size`, a backbone of `multiply_adds_per_image` (symbols.cost)."""
    global_batch = batch_size * world
    num_local = -(-num_classes // world)
    draws = draws_per_visit(sample_ratio, num_classes, global_batch)
    nearest = nearest_measured(MEASURED, draws)
    safe = max(sample_ratio, safe_ratio(num_classes, global_batch))

    def step_flops(ratio):
        return (head_flops(most_rows_scored(num_local, ratio, global_batch), global_batch, embedding_size)
                + backbone_flops(multiply_adds_per_image, batch_size))
    return Regime(sample_ratio, draws, num_sample_for(num_local, sample_ratio),
                  f"at {nearest[0]:g} it cost {nearest[1]}", safe, step_flops(safe) / step_flops(sample_ratio))
