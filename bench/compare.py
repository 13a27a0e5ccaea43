"""Compare sample_fc with the field's trainer: learning and speed, both sides in each run.

    scripts/test.sh                            # once: installs torch (CPU; not needed for training)
    .venv/bin/python -m bench.compare [--dataset demo] [--network mbf|r18|..|r200|vit_t|..]
        [--loss L] [--set key=value ...] [--np 2] [--only sample_fc|torch] [--seeds 0,1,2]
        [--runs 3] [--torch-data rec|memory] [--torch-clip 5] [--eval-every N] [--yardsticks asis,tuned]
        [--torch-centers arcface_torch|bank]

Both train the same recipe (the dataset preset's, with --network/--loss/--set, as
`train.py --print-config` resolves it; default the demo, built on first use) for the same
steps on the same .rec and are scored on the same held-out pairs with the same 10-fold
verification. sample_fc runs as users run it (horovodrun, --np workers, Gloo, train.py's
threads). The other side is the yardstick (bench/yardstick/: insightface
arcface_torch's train_v2.py step, its own network layouts, PartialFC_V2, CombinedMarginLoss,
SGD or AdamW over every parameter, clip 5) in this process with the whole global batch, torch's
default threads, fed by its DataLoader (2 worker processes decoding the .rec per step, one
prefetch thread: --torch-data rec) or from images decoded once before timing (memory): the
row "yardstick". Beside it (--yardsticks, default both with one process) the row "tuned": the
same step as a skilled PyTorch user runs it on a CPU (yardstick/tuned.py: channels-last model
and batches, images in memory, torch's default threads, the fastest count here).
It trains sample_fc's recipe: network (mbf = arcface_torch's mbf, r18..r200 its IResNets, vit_t..
its ViTs; no other), embedding size, image size, classes, global batch (batch_size x np), lr
(scaled by the global batch as train.py does) and sample_fc's lr schedule (lr_schedule: step
with its warm-up, or poly, cosine; the same lr at every update, not arcface_torch's
PolynomialLRWarmup), weight decay wd (arcface_torch's way: on every parameter), the optimizer
(SGD with momentum 0.9, or AdamW: on the yardstick's side the centers too, as arcface_torch
trains them, where sample_fc's bank keeps SGD at bank_lr), the loss preset's
margins as CombinedMarginLoss (m1, m2, m3) with scale loss_s (ArcFace or CosFace only),
sample_ratio as sample_rate (auto resolved as train.py does; no ratio warm-up, no sampling
corrections on that side).
Prints both loss curves side by side, both accuracies, then speed: each run trains both
sides (sample_fc first in odd runs, the yardstick first in even ones), each side's global
samples/s over the steps after the first SPEED_SKIP_STEPS (start-up and verification
excluded), a table of the runs and the median of their ratios; with --seeds, every seed
gets --runs runs and the loss is averaged over them all. With --eval-every N both sides
verify every N steps, and each training's time to the yardstick's mean final accuracy is
reported (time_to_accuracy). SIGTERM or Ctrl-C ends compare and the training it runs.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile

from easydict import EasyDict

from sample_fc.ranks import cores_per_worker
from sample_fc.run.run_root import read_progress, read_status
from . import time_to_accuracy
from .compare_yardstick import (ROOT, SPEED_SKIP_STEPS, malloc_note, run_torch, yardstick_data_layout,
                                yardstick_refusal)

SHOWN = ("samples/s", "accuracy", "error")     # which of the job's lines to echo (display only)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="demo", help="dataset preset (default demo)")
    parser.add_argument("--network", help="network preset, for both (default mbf, arcface_torch's "
                                           "MobileFaceNet; with --only sample_fc, the dataset's)")
    parser.add_argument("--loss", help="loss preset (default: the dataset's recipe)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for both trainers (repeatable), e.g. max_update=400")
    parser.add_argument("--np", type=int, default=2, help="sample_fc workers (default 2)")
    parser.add_argument("--only", choices=("sample_fc", "torch"), help="run one side only (torch: the yardstick)")
    parser.add_argument("--seeds", type=seed_list, default=None, metavar="N,N,...",
                        help="train once per seed (config key seed) and report the mean; default: the config's seed")
    parser.add_argument("--train-arg", action="append", default=[], metavar="ARG",
                        help="extra train.py argument for the sample_fc side only (repeatable)")
    parser.add_argument("--runs", type=positive_int, default=1,
                        help="train both sides this many times per seed, alternating which goes first (default 1)")
    parser.add_argument("--torch-data", choices=("rec", "memory"), default="rec",
                        help="yardstick: the .rec decoded per step by its 2-worker DataLoader (default), "
                        "or decoded once into memory before training")
    parser.add_argument("--eval-every", type=positive_int, default=None, metavar="N",
                        help="verify both sides every N steps (a multiple of the recipe's frequent) and at the "
                        "end, and report each side's training time to the yardstick's final accuracy")
    parser.add_argument("--torch-np", type=positive_int, default=1, metavar="N",
                        help="yardstick: N processes as train_v2.py runs them on N GPUs (DDP, each its B/N images "
                        "and its own BatchNorm statistics, PartialFC_V2's centers split by class; images in memory, "
                        "sample rate 1; default 1: one process with the whole batch)")
    parser.add_argument("--yardsticks", type=yardstick_list, default=None, metavar="asis,tuned",
                        help="the yardstick rows: asis (arcface_torch as it runs: NCHW batches from --torch-data) "
                        "and tuned (channels-last model and batches, images in memory); default both, asis only "
                        "with --torch-np N")
    parser.add_argument("--torch-clip", type=float, default=5.0,
                        help="yardstick: backbone gradient-norm clip (0 = none; default 5 as arcface_torch)")
    parser.add_argument("--torch-centers", choices=("arcface_torch", "bank"), default="arcface_torch",
                        help="yardstick: the class centers in the backbone's optimizer (arcface_torch, default) or "
                        "on SGD with momentum 0.9 at sample_fc's bank_lr and bank_wd (bank: its bank's recipe)")
    parser.add_argument("--arcface-torch", metavar="DIR", help="yardstick: train arcface_torch's own backbone, "
                        "partial_fc_v2.py and losses.py, imported from DIR (a checkout's recognition/arcface_torch), "
                        "instead of the yardstick's copies of them")
    parser.add_argument("--results", metavar="FILE", help="append one JSON line per training to FILE: side, seed, "
                        "run, the overrides, accuracy, losses, samples/s and the centers' norm and turn per step")
    args = parser.parse_args(argv)
    if args.arcface_torch:
        from .yardstick.upstream import not_arcface_torch
        if not_arcface_torch("--arcface-torch", args.arcface_torch):
            parser.error(not_arcface_torch("--arcface-torch", args.arcface_torch))
    if args.network is None and args.only != "sample_fc":
        args.network = "mbf"            # the yardstick has arcface_torch's networks only
    return args


def positive_int(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)


YARDSTICKS = {"asis": "yardstick", "tuned": "tuned"}     # --yardsticks word -> the row's name


def yardstick_list(text):
    words = text.split(",")
    if not words or any(word not in YARDSTICKS for word in words) or len(set(words)) != len(words):
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct words of {', '.join(YARDSTICKS)}, "
                                         f"e.g. asis,tuned")
    return words


def seed_list(text):
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers, e.g. 0,1,2")
    if len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected distinct integers >= 0")
    return seeds


def presets(args):
    """train.py's --network and --loss arguments for the chosen presets."""
    return (["--network", args.network] if args.network else []) + (["--loss", args.loss] if args.loss else [])


def config(args):
    """The run's config as train.py resolves it (`train.py --print-config`: presets, --set, the
    dataset's property file), so both trainers train the same recipe."""
    command = [sys.executable, os.path.join(ROOT, "train.py"), "--dataset", args.dataset, "--print-config"] + \
        presets(args) + [a for kv in args.overrides for a in ("--set", kv)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"compare: error: {result.stderr.strip()}")
    return EasyDict(json.loads(result.stdout))


def run_sample_fc(args, models_root):
    """Train with horovodrun as a user would; return ([(step, loss)], {target: accuracy}, samples/s,
    the accuracy curve of time_to_accuracy (with --eval-every, else []), [the centers' statistics
    (run/center_probe.py) with their step]) from the run's progress records, events and status
    (the last verification: the final model's)."""
    venv_bin = os.path.dirname(sys.executable)
    env = dict(os.environ)                # threads: train.py's own share of the cores (ranks.share_cores)
    command = [os.path.join(venv_bin, "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
               sys.executable, os.path.join(ROOT, "train.py"), "--dataset", args.dataset,
               "--models-root", models_root] + presets(args) + [a for kv in args.overrides for a in ("--set", kv)] + \
        (["--set", f"verify_period={args.eval_every}"] if args.eval_every else []) + args.train_arg
    print("sample_fc:", " ".join(command), flush=True)
    lines = []
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        try:
            for line in proc.stdout:
                lines.append(line)
                if any(word in line for word in SHOWN):
                    print("  " + line.rstrip(), flush=True)
        except BaseException:             # stopped (stop_on_sigterm, Ctrl-C) or failed: the job stops too
            proc.send_signal(signal.SIGTERM)      # horovodrun stops its workers on SIGTERM
            proc.wait()
            raise
    if proc.returncode:
        sys.exit(f"compare: sample_fc's run failed (exit {proc.returncode}); its last lines:\n"
                 + "".join(lines[-15:]))
    records = read_progress(models_root)
    losses = [(record["step"], record["loss"]) for record in records]
    verification = (read_status(models_root) or {}).get("verification", {})
    accuracy = verification.get("accuracy", {})
    curve = (time_to_accuracy.sample_fc_curve(models_root, next(iter(accuracy)), args.global_batch)
             if args.eval_every and accuracy else [])
    centers = [{key: record[key] for key in ("step", "center_norm", "center_turn_deg")}
               for record in records if "center_turn_deg" in record]
    return losses, accuracy, samples_per_s(records, SPEED_SKIP_STEPS), curve, centers


def samples_per_s(records, skip):
    """Global samples/s over the progress windows that start at or after step `skip` (each
    record's samples_per_s covers the steps since the previous record): the windows' speeds
    averaged as total samples over total time (the global batch is the same in every window)."""
    kept = [(last - first, seconds) for first, last, seconds in time_to_accuracy.progress_windows(records)
            if first >= skip]
    seconds = sum(seconds for _, seconds in kept)        # per global sample
    return sum(steps for steps, _ in kept) / seconds if seconds else None


def sample_fc_layout(args, cfg):
    """Processes and threads of the sample_fc side, as train.py sets them (ranks.share_cores)."""
    threads = os.environ.get("OMP_NUM_THREADS") or cores_per_worker(args.np)
    engine = os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")
    return (f"{args.np} worker processes x {threads} OpenMP threads ({engine} MXNet engine thread, "
            f"{cfg.data_threads} decoding threads each)")


def mean_curve(curves):
    """The loss at each logged step averaged over the runs that logged it."""
    by_step = {}
    for curve in curves:
        for step, loss in curve:
            by_step.setdefault(step, []).append(loss)
    return [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]


def accuracy_summary(per_seed):
    """'target a0 a1 ... (mean m, spread max-min)' for each target; per_seed: [{target: acc}]."""
    parts = []
    for target in per_seed[0]:
        values = [result[target] for result in per_seed]
        text = f"{target} " + " ".join(f"{a:.4f}" for a in values)
        if len(values) > 1:
            text += f" (mean {sum(values) / len(values):.4f}, spread {max(values) - min(values):.4f})"
        parts.append(text)
    return ", ".join(parts)


def speed_table(sample_fc_speeds, *yardsticks_speeds, names=("yardstick",)):
    """(lines of the table: run, each side's samples/s (two decimals below 10), sample_fc's ratio
    to each yardstick row (`names`); the median of each ratio over the runs, or None).
    A side that did not run or measure has None (and its run no ratio to it)."""
    lines = [f"  {'run':>3}  {'sample_fc':>10}  " + "  ".join(f"{name:>10}" for name in names) + "  "
             + "  ".join(f"{'/ ' + name:>11}" for name in names)]
    ratios = [[] for _ in names]
    for run, (ours, *theirs) in enumerate(zip(sample_fc_speeds, *yardsticks_speeds), start=1):
        row = [ours / their if ours and their else None for their in theirs]
        for found, ratio in zip(ratios, row):
            if ratio is not None:
                found.append(ratio)
        cells = [f"{v:10.{2 if v < 10 else 1}f}" if v else f"{'-':>10}" for v in (ours, *theirs)]   # r50: ~5/s
        lines.append(f"  {run:3d}  " + "  ".join(cells) + "  "
                     + "  ".join(f"{ratio:11.3f}" if ratio else f"{'-':>11}" for ratio in row))
    return lines, [statistics.median(found) if found else None for found in ratios]


def report(curves, accuracies, speeds, trainings, layouts):
    """curves: name -> [curve per training]; accuracies: name -> [{target: accuracy} per training];
    speeds: name -> [samples/s per training]; trainings: [(seed, run)]; layouts: name -> line."""
    names = list(curves)
    mean = {name: dict(mean_curve(curves[name])) for name in names}
    steps = sorted({s for curve in mean.values() for s in curve})
    over = f", averaged over {len(trainings)} trainings" if len(trainings) > 1 else ""
    print(f"\nloss (mean over the steps since the previous row{over})")
    print("  step  " + "".join(f"{n:>12}" for n in names))
    for step in steps:
        row = [mean[n].get(step) for n in names]
        print(f"  {step:4d}  " + "".join(f"{v:12.4f}" if v is not None else f"{'-':>12}" for v in row))
    print("\nheld-out verification accuracy (10-fold, flip), per training "
          + ", ".join(f"seed {seed} run {run}" for seed, run in trainings))
    for name in names:
        print(f"  {name:>10}: " + accuracy_summary(accuracies[name]))
    print(f"\nspeed (global samples/s over the steps after the first {SPEED_SKIP_STEPS})")
    for name in names:
        print(f"  {name:>10}: {layouts[name]}")
    missing = [None] * len(trainings)
    rows = [name for name in names if name != "sample_fc"] or ["yardstick"]
    lines, medians = speed_table(speeds.get("sample_fc", missing), *(speeds.get(name, missing) for name in rows),
                                 names=rows)
    print("\n".join(lines))
    for name, median in zip(rows, medians):
        if median is not None:
            print(f"  median ratio sample_fc / {name}: {median:.3f}")


def release_freed_memory():
    """Give the yardstick's freed memory back to the system before sample_fc's run, which plans
    its memory from what is available: with glibc told to keep freed memory (malloc_note) this
    process would otherwise hold the yardstick's peak (~10 GB at 112 px) through it."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):      # not glibc: nothing is held back this way
        pass


def train_both(args, order, curves, accuracies, speeds, accuracy_curves):
    """One training of each side (in `order`), results appended to the per-side lists."""
    for name in order:
        if name == "sample_fc":
            with tempfile.TemporaryDirectory(prefix="compare-") as models_root:
                result = run_sample_fc(args, models_root)
        else:
            result = run_torch(args, config(args), tuned=name == "tuned")
            release_freed_memory()
        for table, value in zip((curves, accuracies, speeds, accuracy_curves), result):
            table.setdefault(name, []).append(value)
        if args.results:
            append_result(args, name, result)


def append_result(args, name, result):
    """One JSON line of a training into args.results (the file bench.center_study summarises)."""
    losses, accuracy, speed, _, centers = result
    seed = next((int(kv.split("=", 1)[1]) for kv in reversed(args.overrides) if kv.startswith("seed=")), None)
    line = {"side": name, "network": args.network, "overrides": args.overrides, "seed": seed,
            "train_args": args.train_arg if name == "sample_fc" else None,
            "arcface_torch": bool(args.arcface_torch) if name != "sample_fc" else None,
            "np": args.np, "accuracy": accuracy, "losses": losses, "samples_per_s": speed, "centers": centers}
    with open(args.results, "a") as out:
        out.write(json.dumps(line) + "\n")


def stop_on_sigterm(number, frame):
    """SIGTERM to compare alone (`kill PID`) ends it as Ctrl-C would, its training job with it."""
    sys.exit(f"compare: stopped by {signal.Signals(number).name}")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    cfg = config(args)                   # builds the demo data on first use, as train.py does
    args.global_batch = cfg.batch_size * args.np
    if args.eval_every and args.eval_every % cfg.frequent:
        sys.exit(f"compare: --eval-every {args.eval_every} is not a multiple of the recipe's frequent={cfg.frequent} "
                 f"(sample_fc's training time is known at its progress records; --set frequent=N to change it)")
    if args.yardsticks is None:
        args.yardsticks = ["asis", "tuned"] if args.torch_np == 1 else ["asis"]
    elif "tuned" in args.yardsticks and args.torch_np > 1:
        sys.exit("compare: --torch-np N runs arcface_torch as it runs on N GPUs; the tuned row is one process "
                 "(--yardsticks asis)")
    yardsticks = [YARDSTICKS[word] for word in args.yardsticks]
    sides = (["sample_fc"] if args.only != "torch" else []) + (yardsticks if args.only != "sample_fc" else [])
    layouts = {"sample_fc": sample_fc_layout(args, cfg) + malloc_note()}
    if args.only != "sample_fc":
        try:
            import torch
        except ImportError:
            sys.exit("compare: PyTorch is not installed; run `scripts/test.sh -k yardstick` once (the test script "
                     "installs torch 2.13.0, CPU build, and its pinned dependencies: requirements-test.txt)")
        args.torch_threads = torch.get_num_threads()      # torch's default, before mxnet is imported here
        refusal = yardstick_refusal(cfg)
        if refusal:
            sys.exit(f"compare: {refusal}")
        if args.torch_np > 1 and (args.eval_every or args.torch_data != "memory"):
            sys.exit("compare: --torch-np N trains the yardstick from images in memory and verifies at the end only "
                     "(--torch-data memory, no --eval-every)")
        processes = (f"{args.torch_np} DDP processes x {max(1, args.torch_threads // args.torch_np)}"
                     if args.torch_np > 1 else f"1 process x {args.torch_threads}")
        layouts["yardstick"] = (f"{processes} torch threads; {yardstick_data_layout(args.torch_data)}"
                                + malloc_note())
        layouts["tuned"] = (f"1 process x {args.torch_threads} torch threads; channels-last model and batches; "
                            f"{yardstick_data_layout('memory')}" + malloc_note())
    trainings = [(seed, run) for seed in (args.seeds or [cfg.seed]) for run in range(1, args.runs + 1)]
    base_overrides = list(args.overrides)
    curves, accuracies, speeds, accuracy_curves = {}, {}, {}, {}
    for index, (seed, run) in enumerate(trainings):
        args.overrides = base_overrides + ([f"seed={seed}"] if args.seeds else [])
        print(f"\n== seed {seed}, run {run}", flush=True)
        train_both(args, sides if index % 2 == 0 else sides[::-1], curves, accuracies, speeds, accuracy_curves)
    report(curves, accuracies, speeds, trainings, {name: layouts[name] for name in sides})
    if args.eval_every and "sample_fc" in sides and "yardstick" in sides:
        print("\ntime to accuracy (training seconds: verification, checkpoints and start-up left out)")
        print("\n".join(time_to_accuracy.report_lines(accuracy_curves, trainings)[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
