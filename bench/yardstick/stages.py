"""The yardstick's step timed by stage, for bench.step_breakdown.

Each step: the wait for the next batch (`data`: the loader's queue, or the in-memory gather),
then Trainer.step with a StageClock marking its stages: `forward` (backbone), `head`
(PartialFC: normalise, logits, margin, cross-entropy), `backward` (all of it: head and
backbone), `clip` (the backbone's gradient norm), `update` (SGD step, zero_grad, lr). PyTorch
on the CPU runs each operation to its end before returning, so the marks time what they name.
"""
import statistics
import time

STAGES = ("data", "forward", "head", "backward", "clip", "update")


class StageClock:
    """Seconds per stage: each mark(stage) closes the stage that began at the previous mark."""

    def __init__(self):
        self.seconds = {}
        self.last = time.perf_counter()

    def __call__(self, stage):
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self.last
        self.last = now


def timed_step(trainer, batches):
    """One step of `trainer` on the next of `batches`: {stage: seconds} (STAGES)."""
    clock = StageClock()
    images, labels = next(batches)
    clock("data")
    trainer.step(images, labels, mark=clock)
    return clock.seconds


def stage_medians(trainer, batches, steps, warmup=3):
    """Median ms per stage over `steps` timed steps after `warmup` untimed ones, and 'step':
    the median of the steps' totals."""
    for _ in range(warmup):
        trainer.step(*next(batches))
    timed = [timed_step(trainer, batches) for _ in range(steps)]
    medians = {stage: statistics.median(t[stage] for t in timed) * 1e3 for stage in STAGES}
    medians["step"] = statistics.median(sum(t.values()) for t in timed) * 1e3
    return medians
