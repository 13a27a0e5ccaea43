"""Time to accuracy for bench.compare: each side's held-out accuracy against its training time.

A curve is [(step, training seconds, accuracy)], one point per verification (compare's
--eval-every N). Training seconds run from the first step's start (for sample_fc: the moment
its progress logger started, just before step 1) to the end of that step, with verification
and checkpoints left out on both sides; process start-up (horovodrun, imports, data loaders
starting) is not in them on either side. The target is the mean of the yardstick's final
accuracies; the yardstick's time is its whole training's, sample_fc's the training seconds at
its first verification at or above the target.
"""
def progress_windows(records):
    """(first step, last step, seconds per global sample) of each progress record's window: a
    record's samples_per_s covers the steps since the previous record (from 0 for the first)
    with the paused time taken out, so a window's training seconds are its steps x the global
    batch / samples_per_s."""
    previous = 0
    for record in records:
        if record.get("samples_per_s"):
            yield previous, record["step"], (record["step"] - previous) / record["samples_per_s"]
        previous = record["step"]


def sample_fc_curve(models_root, target, global_batch):
    """The curve of a sample_fc run's target `target` from its progress and verification records
    (tools.report.read_run). Verification at step S comes after S's progress record: S must be
    a multiple of the run's `frequent` (compare checks it)."""
    from sample_fc.tools.report import read_run
    run = read_run(models_root, "sample_fc", print)
    seconds_at, total = {}, 0.0
    for _, step, seconds_per_sample in progress_windows(run.progress):
        total += seconds_per_sample * global_batch
        seconds_at[step] = total
    return [(step, seconds_at[step], accuracy[target]) for step, accuracy, _, _ in run.verifications()
            if step in seconds_at and target in accuracy]


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
             f"  {'seed':>4} {'run':>3}  {'sample_fc: s to the target (step)':>36}  "
             f"{'yardstick: s to its end (final)':>34}"]
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
