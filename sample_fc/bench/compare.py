"""Compare sample_fc's learning with a plain PyTorch trainer of the same recipe.

    scripts/test.sh                            # once: installs torch (CPU; not needed for training)
    .venv/bin/python -m sample_fc.bench.compare [--dataset demo] [--network N] [--loss L] [--set key=value ...]
        [--np 2] [--only sample_fc|torch] [--seeds 0,1,2] [--torch-clip 5]
        [--torch-init torch|xavier2] [--torch-wd all|mxnet]

Both train the dataset preset's recipe (default: the demo's, on the demo data built on
first use) for the same steps on the same .rec, and are scored on the same held-out pairs
with the same 10-fold verification. sample_fc runs as users run it (horovodrun, --np
workers, Gloo); the reference (sample_fc/bench/torch_reference.py) runs in this process
with the whole global batch. Prints both loss curves side by side, then both accuracies;
with --seeds, each side trains once per seed (init, data order, sampling) and the table
has the loss averaged over the seeds and each seed's accuracy with their mean and spread.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from easydict import EasyDict

from ..run.run_root import read_progress, read_status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHOWN = ("samples/s", "accuracy", "error")     # which of the job's lines to echo (display only)
SPEED_SKIP_STEPS = 20      # samples/s is measured over the steps after these (start-up, first oneDNN primitives)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m sample_fc.bench.compare", description=__doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="demo", help="dataset preset of default.py (default demo)")
    parser.add_argument("--network", help="network preset of default.py, for both (default: the dataset's)")
    parser.add_argument("--loss", help="loss preset of default.py (default: the dataset's recipe)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for both trainers (repeatable), e.g. max_update=400")
    parser.add_argument("--np", type=int, default=2, help="sample_fc workers (default 2)")
    parser.add_argument("--only", choices=("sample_fc", "torch"), help="run one side only")
    parser.add_argument("--seeds", type=seed_list, default=None, metavar="N,N,...",
                        help="train once per seed (config key seed) and report the mean; default: the config's seed")
    parser.add_argument("--train-arg", action="append", default=[], metavar="ARG",
                        help="extra train.py argument for the sample_fc side only (repeatable)")
    parser.add_argument("--torch-clip", type=float, default=5.0,
                        help="reference: backbone gradient-norm clip (0 = none; default 5 as arcface_torch)")
    parser.add_argument("--torch-init", choices=("torch", "xavier2"), default="torch",
                        help="reference: PyTorch's default init, or sample_fc's Xavier magnitude 2")
    parser.add_argument("--torch-wd", choices=("all", "mxnet"), default="all",
                        help="reference: weight decay on every parameter, or MXNet's rule (not on betas)")
    parser.add_argument("--torch-momentum", choices=("torch", "mxnet"), default="torch",
                        help="reference: PyTorch's momentum (in gradient units) or MXNet's (in lr-scaled steps)")
    return parser.parse_args(argv)


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
    """Train with horovodrun as a user would; return ([(step, loss)], {target: accuracy}, samples/s)
    from the run's progress records and its status (the last verification: the final model's)."""
    venv_bin = os.path.dirname(sys.executable)
    env = dict(os.environ)                # threads: train.py's own share of the cores (ranks.share_cores)
    command = [os.path.join(venv_bin, "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}", "--gloo",
               sys.executable, os.path.join(ROOT, "train.py"), "--dataset", args.dataset,
               "--models-root", models_root] + presets(args) + [a for kv in args.overrides for a in ("--set", kv)] + args.train_arg
    print("sample_fc:", " ".join(command), flush=True)
    lines = []
    with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            lines.append(line)
            if any(word in line for word in SHOWN):
                print("  " + line.rstrip(), flush=True)
    if proc.returncode:
        sys.exit(f"compare: sample_fc's run failed (exit {proc.returncode}); its last lines:\n"
                 + "".join(lines[-15:]))
    records = read_progress(models_root)
    losses = [(record["step"], record["loss"]) for record in records]
    verification = (read_status(models_root) or {}).get("verification", {})
    return losses, verification.get("accuracy", {}), samples_per_s(records, SPEED_SKIP_STEPS)


def samples_per_s(records, skip):
    """Global samples/s over the progress windows that start at or after step `skip` (each
    record's samples_per_s covers the steps since the previous record): the windows' speeds
    averaged as total samples over total time (the global batch is the same in every window)."""
    steps = step_seconds = 0.0          # step_seconds: seconds per global sample, summed over steps
    for previous, record in zip(records, records[1:]):
        if previous["step"] >= skip and record.get("samples_per_s"):
            window = record["step"] - previous["step"]
            steps += window
            step_seconds += window / record["samples_per_s"]
    return steps / step_seconds if step_seconds else None


def run_torch(args, cfg):
    from sample_fc.data.bin_format import load_bin
    from sample_fc.data.iterators import FaceRecordIter
    from . import torch_reference
    rec = os.path.join(ROOT, cfg.rec) if not os.path.isabs(cfg.rec) else cfg.rec
    target = cfg.val_targets[0]
    images, issame = load_bin(os.path.join(os.path.dirname(rec), target + ".bin"), cfg.image_size)
    train_iter = FaceRecordIter(rec, cfg.batch_size * args.np, (3, cfg.image_size, cfg.image_size),
                                seed=cfg.seed, num_threads=cfg.data_threads, num_classes=cfg.num_classes)
    print(f"torch reference: clip {args.torch_clip:g}, init {args.torch_init}, weight decay on "
          f"{args.torch_wd}, {os.cpu_count()} threads, global batch {cfg.batch_size * args.np}", flush=True)
    result = torch_reference.train(cfg, train_iter, images, issame, args.np, clip_grad_norm=args.torch_clip,
                                   init=args.torch_init, wd_all=args.torch_wd == "all",
                                   mxnet_momentum=args.torch_momentum == "mxnet",
                                   log=lambda line: print("  " + line, flush=True), threads=os.cpu_count(),
                                   speed_skip=SPEED_SKIP_STEPS)
    train_iter.close()
    return result["losses"], {target: result["accuracy"]}, result["samples_per_s"]


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


def report(curves, accuracies, speeds, seeds):
    """curves: name -> [curve per seed]; accuracies: name -> [{target: accuracy} per seed];
    speeds: name -> [samples/s per seed]."""
    names = list(curves)
    mean = {name: dict(mean_curve(curves[name])) for name in names}
    steps = sorted({s for curve in mean.values() for s in curve})
    over = f", averaged over seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    print(f"\nloss (mean over the steps since the previous row{over})")
    print("  step  " + "".join(f"{n:>12}" for n in names))
    for step in steps:
        row = [mean[n].get(step) for n in names]
        print(f"  {step:4d}  " + "".join(f"{v:12.4f}" if v is not None else f"{'-':>12}" for v in row))
    print("\nheld-out verification accuracy (10-fold, flip)" + (f", seeds {','.join(map(str, seeds))}" if over else ""))
    for name in names:
        print(f"  {name:>10}: " + accuracy_summary(accuracies[name]))
    print(f"\nspeed (global samples/s over the steps after the first {SPEED_SKIP_STEPS})")
    for name in names:
        values = [f"{v:.1f}" if v else "- (run too short)" for v in speeds[name]]
        print(f"  {name:>10}: " + " ".join(values))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = config(args)                   # builds the demo data on first use, as train.py does
    if args.only != "sample_fc":
        try:
            import torch  # noqa: F401
        except ImportError:
            sys.exit("compare: PyTorch is not installed; run `scripts/test.sh -k torch_reference` once (it installs torch 2.13.0, CPU build, and its pinned dependencies: requirements-test.txt)")
    seeds = args.seeds or [cfg.seed]
    base_overrides = list(args.overrides)
    curves, accuracies, speeds = {}, {}, {}
    for seed in seeds:
        args.overrides = base_overrides + ([f"seed={seed}"] if args.seeds else [])
        results = {}
        if args.only != "torch":
            with tempfile.TemporaryDirectory(prefix="compare-") as models_root:
                results["sample_fc"] = run_sample_fc(args, models_root)
        if args.only != "sample_fc":
            results["torch"] = run_torch(args, config(args))
        for name, (curve, accuracy, speed) in results.items():
            curves.setdefault(name, []).append(curve)
            accuracies.setdefault(name, []).append(accuracy)
            speeds.setdefault(name, []).append(speed)
    report(curves, accuracies, speeds, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
