"""Which optimizer the class centers get, and why: SGD with momentum, or plain SGD at the step
momentum builds up to (lr / (1 - momentum)), chosen by how often a class comes back.

A class is in the global batch B/C times per step on average, so its center gets its own
positive push about once every C/B steps (the visit gap). Momentum m keeps a push for about
1 / (1 - m) steps (10 at 0.9): with classes that come back sooner it averages several visits; with
classes that come back later it never holds two, and only delays each. Where the centers'
momentum has been measured against none on real images (MEASURED), the gap decided it.
`bank_momentum=auto` is this rule; a run's start-up line (`line`) says what the centers got.
"""
from dataclasses import dataclass

from .sampling_regime import nearest_measured

MOMENTUM_UNTIL_GAP = 10.0       # visit gaps (C/B) below this keep the centers' momentum
MEASURED = (                    # (C/B, none against momentum 0.9 at ratio 1.0, 1,000 steps; BENCHMARKS.md)
    (1.6, "-1.0 point on the demo's 200 synthetic identities (five seeds)"),
    (39.1, "+3.0 points on 5,000 glyph identities (three seeds)"),
    (156.2, "+1.5 points on 20,000 glyph identities (one seed; seeds there spread 9 points)"),
)


def visit_gap(num_classes, global_batch):
    """C/B: the mean number of steps between two visits of a class to the global batch."""
    return num_classes / global_batch


def auto_momentum(num_classes, global_batch):
    """bank_momentum for `auto`: 'same' (momentum kept, stored as the weights) where classes
    come back within MOMENTUM_UNTIL_GAP steps, else 'none'."""
    return "same" if visit_gap(num_classes, global_batch) < MOMENTUM_UNTIL_GAP else "none"


@dataclass(frozen=True)
class CenterOptimizer:
    bank_momentum: str          # same | int8 | none, resolved
    automatic: bool             # chosen by bank_momentum=auto
    momentum: float
    gap: float                  # C/B

    def line(self):
        """The centers' optimizer in one line (the start-up log, tools.plan)."""
        if self.bank_momentum == "none":
            what = f"plain SGD at lr / (1 - {self.momentum:g}), no momentum"
        else:
            what = f"SGD with momentum {self.momentum:g}" + (" (8-bit)" if self.bank_momentum == "int8" else "")
        nearest = nearest_measured(MEASURED, self.gap)
        why = (f"bank_momentum=auto: a class comes back every {self.gap:.1f} steps (C/B), momentum is kept below "
               f"{MOMENTUM_UNTIL_GAP:g}" if self.automatic else f"bank_momentum={self.bank_momentum}; "
               f"a class comes back every {self.gap:.1f} steps (C/B)")
        return (f"class centers: {what} ({why}; none against momentum measured {nearest[1]} at C/B "
                f"{nearest[0]:g}, docs/training.md 'The centers' optimizer')")


def center_optimizer(bank_momentum, momentum, num_classes, global_batch):
    """The CenterOptimizer of a config's bank_momentum (auto resolved here) for its classes and batch."""
    automatic = bank_momentum == "auto"
    chosen = auto_momentum(num_classes, global_batch) if automatic else bank_momentum
    return CenterOptimizer(chosen, automatic, momentum, visit_gap(num_classes, global_batch))
