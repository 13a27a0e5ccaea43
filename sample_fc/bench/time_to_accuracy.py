"""Time to accuracy for bench.compare: each side's held-out accuracy against its training time.

A curve is [(step, training seconds, accuracy)], one point per verification (compare's
--eval-every N). Training seconds run from the first step's start (for sample_fc: the moment
its progress logger started, just before step 1) to the end of that step, with verification
and checkpoints left out on both sides; process start-up (horovodrun, imports, data loaders
starting) is not in them on either side. The target is the mean of the yardstick's final
accuracies; the yardstick's time is its whole training's, sample_fc's the training seconds at
its first verification at or above the target.
"""
import os

from ..run.run_root import EVENTS_FILE, PROGRESS_FILE


def sample_fc_curve(models_root, target, global_batch):
    """The curve of a sample_fc run's target `target` from its progress.jsonl and events.jsonl.
    A progress record's samples_per_s covers the steps since the previous record with the
    paused time taken out, so the training seconds at a record's step are the sum of each
    window's samples / samples_per_s (every window's samples: its steps x the global batch).
    Verification at step S comes after S's progress record: S must be a multiple of the
    run's `frequent` (compare checks it)."""
    from ..tools.report import read_records
    progress = read_records(os.path.join(models_root, PROGRESS_FILE), ("step", "samples_per_s"), print)
    events = read_records(os.path.join(models_root, EVENTS_FILE), ("step", "event"), print)
    seconds_at, total, previous = {}, 0.0, 0
    for record in progress:
        total += (record["step"] - previous) * global_batch / record["samples_per_s"]
        seconds_at[record["step"]] = total
        previous = record["step"]
    return [(e["step"], seconds_at[e["step"]], e["accuracy"][target]) for e in events
            if e["event"] == "verification" and e["step"] in seconds_at and target in e.get("accuracy", {})]


def first_reach(curve, target):
    """(step, seconds) of the curve's first point at or above `target`, or None."""
    for step, seconds, accuracy in curve:
        if accuracy >= target:
            return step, seconds
    return None


def report_lines(curves, trainings):
    """The time-to-accuracy section. curves: {"sample_fc": [curve per training], "yardstick":
    [...]}; trainings: [(seed, run)]. The yardstick's time is its whole training's (the time
    to its own final accuracy); sample_fc's, the time to its first verification at or above
    the target. Returns (lines, ratio): ratio = sample_fc's mean time / the yardstick's, None
    unless sample_fc reached the target in every training."""
    finals = [curve[-1][2] for curve in curves["yardstick"] if curve]
    if len(finals) < len(trainings):
        return ["  (a training of the yardstick has no verification)"], None
    target = sum(finals) / len(finals)
    lines = [f"  target: the yardstick's final accuracy, mean of {len(finals)}: {target:.4f}",
             f"  {'seed':>4} {'run':>3}  {'sample_fc: s to the target (step)':>36}  {'yardstick: s to its end (final)':>34}"]
    ours, theirs = [], []
    for (seed, run), mine, yardstick in zip(trainings, curves["sample_fc"], curves["yardstick"]):
        hit = first_reach(mine, target)
        ours.append(hit[1] if hit else None)
        theirs.append(yardstick[-1][1])
        best = max((accuracy for _, _, accuracy in mine), default=float("nan"))
        cell = f"{hit[1]:.1f} ({hit[0]})" if hit else f"not reached, best {best:.4f}"
        lines.append(f"  {seed:4d} {run:3d}  {cell:>36}  {f'{theirs[-1]:.1f} ({yardstick[-1][2]:.4f})':>34}")
    missed = sum(value is None for value in ours)
    if missed:
        return lines + [f"  sample_fc did not reach the target in {missed} of {len(ours)} trainings"], None
    ratio = (sum(ours) / len(ours)) / (sum(theirs) / len(theirs))
    lines.append(f"  mean: sample_fc {sum(ours) / len(ours):.1f} s, yardstick {sum(theirs) / len(theirs):.1f} s; "
                 f"sample_fc / yardstick {ratio:.3f}")
    return lines, ratio
