"""Compare sample_fc with the field's trainer: learning and speed, both sides in each run.

    scripts/test.sh                            # once: installs torch (CPU; not needed for training)
    .venv/bin/python -m sample_fc.bench.compare [--dataset demo] [--network mbf|r18|r34|r50|r100]
        [--loss L] [--set key=value ...] [--np 2] [--only sample_fc|torch] [--seeds 0,1,2]
        [--runs 3] [--torch-data rec|memory] [--torch-clip 5]

Both train the same recipe (the dataset preset's, with --network/--loss/--set, as
`train.py --print-config` resolves it; default the demo, built on first use) for the same
steps on the same .rec and are scored on the same held-out pairs with the same 10-fold
verification. sample_fc runs as users run it (horovodrun, --np workers, Gloo, train.py's
threads). The other side is the yardstick (sample_fc/bench/yardstick/: insightface
arcface_torch's train_v2.py step, its own network layouts, PartialFC_V2, CombinedMarginLoss,
SGD over every parameter, clip 5) in this process with the whole global batch, torch's
default threads, fed by its DataLoader (2 worker processes decoding the .rec per step, one
prefetch thread: --torch-data rec) or from images decoded once before timing (memory).
It trains sample_fc's recipe: network (mbf = arcface_torch's mbf, r18..r100 its IResNets; no
other), embedding size, image size, classes, global batch (batch_size x np), lr (scaled by
the global batch as train.py does) and sample_fc's lr schedule (lr_schedule: step with its
warm-up, or poly, cosine; the same lr at every update, not arcface_torch's PolynomialLRWarmup),
weight decay wd (arcface_torch's way: on every parameter), momentum 0.9, the loss preset's
margins as CombinedMarginLoss (m1, m2, m3) with scale loss_s (ArcFace or CosFace only),
sample_ratio as sample_rate (auto resolved as train.py does; no ratio warm-up, no sampling
corrections on that side).
Prints both loss curves side by side, both accuracies, then speed: each run trains both
sides (sample_fc first in odd runs, the yardstick first in even ones), each side's global
samples/s over the steps after the first SPEED_SKIP_STEPS (start-up and verification
excluded), a table of the runs and the median of their ratios; with --seeds, every seed
gets --runs runs and the loss is averaged over them all.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from easydict import EasyDict

from ..config import scaled_lr
from ..ranks import cores_per_worker
from ..run.run_root import read_progress, read_status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHOWN = ("samples/s", "accuracy", "error")     # which of the job's lines to echo (display only)
SPEED_SKIP_STEPS = 20      # samples/s is measured over the steps after these (start-up, first oneDNN primitives)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m sample_fc.bench.compare", description=__doc__.split("\n\n")[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="demo", help="dataset preset of default.py (default demo)")
    parser.add_argument("--network", help="network preset of default.py, for both (default mbf, arcface_torch's "
                                           "MobileFaceNet; with --only sample_fc, the dataset's)")
    parser.add_argument("--loss", help="loss preset of default.py (default: the dataset's recipe)")
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
    parser.add_argument("--torch-clip", type=float, default=5.0,
                        help="yardstick: backbone gradient-norm clip (0 = none; default 5 as arcface_torch)")
    args = parser.parse_args(argv)
    if args.network is None and args.only != "sample_fc":
        args.network = "mbf"            # the yardstick has arcface_torch's networks only
    return args


def positive_int(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1")
    return int(text)


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


# sample_fc's numbers the yardstick needs that only sample_fc's own code computes; run in a
# process of its own: sample_fc.optimizers loads Horovod, and torch may not share a process with it
RECIPE_NUMBERS = """
import json, sys
from easydict import EasyDict
from sample_fc.builder import resolve_auto
from sample_fc.config import scaled_lr
from sample_fc.optimizers import make_schedule
cfg, world = EasyDict(json.load(sys.stdin)), int(sys.argv[1])
resolve_auto(cfg, world)
lr = scaled_lr(cfg, cfg.batch_size * world)
schedule = make_schedule(cfg.lr_schedule, lr, cfg.warmup_steps, cfg.max_update, cfg.lr_steps, cfg.lr_factor)
print(json.dumps({"sample_ratio": cfg.sample_ratio, "lrs": [schedule(n) for n in range(1, cfg.max_update + 1)]}))
"""


def recipe_numbers(cfg, world):
    """{'sample_ratio': the number train.py trains with (auto resolved), 'lrs': the lr of each
    update 1..max_update}, computed by sample_fc's own builder.resolve_auto and make_schedule."""
    result = subprocess.run([sys.executable, "-c", RECIPE_NUMBERS, str(world)], input=json.dumps(cfg), cwd=ROOT,
                            capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"compare: error: sample_fc's lr schedule: {result.stderr.strip().splitlines()[-1]}")
    return json.loads(result.stdout)


def yardstick_recipe(cfg, world, sample_ratio):
    """The yardstick's settings for sample_fc's resolved config on `world` workers (no torch here):
    the same network, shapes, global batch, scaled lr, weight decay, margins and scale (momentum:
    arcface_torch's fixed 0.9, which yardstick_refusal holds the recipe to)."""
    global_batch = cfg.batch_size * world
    return EasyDict(network=cfg.network, image_size=cfg.image_size, embedding_size=cfg.embedding_size,
                    classes=cfg.num_classes, global_batch=global_batch, steps=cfg.max_update,
                    lr=scaled_lr(cfg, global_batch),
                    weight_decay=cfg.wd, margins=(cfg.loss_m1, cfg.loss_m2, cfg.loss_m3),
                    scale=cfg.loss_s, sample_rate=float(sample_ratio), seed=cfg.seed)


def yardstick_refusal(cfg):
    """None, or the one line saying why the yardstick cannot train cfg's recipe (imports torch)."""
    from .yardstick import CombinedMargin
    from .yardstick.networks import NETWORKS
    from .yardstick.training import MOMENTUM
    if cfg.network not in NETWORKS:
        return (f"the yardstick has no network {cfg.network!r}; arcface_torch's networks it has: "
                f"{', '.join(NETWORKS)} (--network NAME)")
    if cfg.momentum != MOMENTUM:
        return (f"momentum={cfg.momentum:g}, but arcface_torch's train_v2.py fixes SGD momentum at {MOMENTUM:g} "
                f"(--set momentum={MOMENTUM:g})")
    try:
        CombinedMargin(cfg.loss_s, cfg.loss_m1, cfg.loss_m2, cfg.loss_m3)
    except ValueError as error:
        return f"loss {cfg.loss}: {error}"
    return None


def sample_fc_layout(args, cfg):
    """Processes and threads of the sample_fc side, as train.py sets them (ranks.share_cores)."""
    threads = os.environ.get("OMP_NUM_THREADS") or cores_per_worker(args.np)
    engine = os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")
    return (f"{args.np} worker processes x {threads} OpenMP threads ({engine} MXNet engine thread, "
            f"{cfg.data_threads} decoding threads each)")


def first_image_side(folder):
    """Height of the .rec's first image, read with PIL: decoding with MXNet in this process
    before the DataLoader forks its workers would start MXNet's threads here and hang them."""
    import io
    import mxnet as mx
    from PIL import Image
    from .yardstick.data import image_indices, open_record
    record = open_record(folder)
    _, payload = mx.recordio.unpack(record.read_idx(int(image_indices(record)[0])))
    record.close()
    return Image.open(io.BytesIO(payload)).size[1]


def yardstick_data_layout(torch_data):
    """How the yardstick's side gets its images (--torch-data rec or memory), in words."""
    from .yardstick.data import LOADER_WORKERS
    if torch_data == "memory":
        return "data decoded once into memory, no loader workers"
    return f"DataLoader with {LOADER_WORKERS} worker processes decoding the .rec per step, 1 prefetch thread"


def yardstick_batches(args, recipe, rec_folder):
    """(endless (images, labels) batches, a close() for them, the data's layout line)."""
    from .yardstick import MemoryFaces, RecFaces, rec_loader
    from .yardstick.data import LOADER_WORKERS, Prefetched
    dataset = RecFaces(rec_folder)
    side = first_image_side(rec_folder)
    if side != recipe.image_size:
        sys.exit(f"compare: {rec_folder} holds {side} px images and the recipe trains at image_size="
                 f"{recipe.image_size}; the yardstick does not resize (--set image_size={side})")
    if args.torch_data == "memory":
        faces = MemoryFaces.from_rec(rec_folder)
        return (faces.batches(recipe.global_batch, seed=recipe.seed), lambda: None,
                f"{yardstick_data_layout('memory')} ({len(faces.labels)} images)")
    loader = Prefetched(rec_loader(dataset, recipe.global_batch, LOADER_WORKERS, seed=recipe.seed))
    return loader, loader.close, yardstick_data_layout("rec")


def rate_after(step_ends, skip, global_batch):
    """Samples/s over the steps after the first `skip`; step_ends[n]: the time step n ended
    (step_ends[0]: the start). None when there are no such steps."""
    steps = len(step_ends) - 1 - skip
    if steps < 1:
        return None
    return steps * global_batch / (step_ends[-1] - step_ends[skip])


def run_torch(args, cfg):
    """Train the yardstick on cfg's recipe in this process; return ([(step, loss)], {target:
    accuracy}, samples/s) as run_sample_fc does."""
    import mxnet  # noqa: F401  (the .rec reader's; importing it leaves torch 1 thread: set them after)
    import torch
    from sample_fc.data.bin_format import load_bin
    from sample_fc.verification import score
    from .yardstick import CombinedMargin, PartialFC, Trainer, build_network
    from .yardstick.scoring import embed_pairs
    numbers = recipe_numbers(cfg, args.np)
    recipe = yardstick_recipe(cfg, args.np, numbers["sample_ratio"])
    rec = cfg.rec if os.path.isabs(cfg.rec) else os.path.join(ROOT, cfg.rec)
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(recipe.seed)
    backbone = build_network(recipe.network, recipe.image_size, recipe.embedding_size)
    head = PartialFC(CombinedMargin(recipe.scale, *recipe.margins), recipe.embedding_size, recipe.classes,
                     recipe.sample_rate)
    lrs = numbers["lrs"]
    trainer = Trainer(backbone, head, recipe.lr, recipe.weight_decay, lr_at=lambda n: lrs[min(n, len(lrs)) - 1],
                      clip_norm=args.torch_clip)
    # the loader last: its workers fork from this process while nothing else runs in it
    batches, close, data_layout = yardstick_batches(args, recipe, os.path.dirname(rec))
    print(f"yardstick: {recipe.network} {recipe.image_size} px, global batch {recipe.global_batch}, lr {recipe.lr:g} "
          f"({cfg.lr_schedule} schedule), wd {recipe.weight_decay:g} on every parameter, margins {recipe.margins} "
          f"s {recipe.scale:g}, sample rate {recipe.sample_rate:g}, clip {args.torch_clip:g}", flush=True)
    print(f"yardstick layout: 1 process, {torch.get_num_threads()} torch threads; {data_layout}", flush=True)
    losses, window, step_ends = [], [], [time.perf_counter()]
    for step in range(1, recipe.steps + 1):
        window.append(float(trainer.step(*next(batches))))
        step_ends.append(time.perf_counter())
        if step % cfg.frequent == 0 or step == recipe.steps:
            losses.append((step, sum(window) / len(window)))
            print(f"  yardstick step {step}/{recipe.steps}  loss {losses[-1][1]:.4f}", flush=True)
            window = []
    close()
    speed = rate_after(step_ends, SPEED_SKIP_STEPS, recipe.global_batch)
    target = cfg.val_targets[0]
    images, issame = load_bin(os.path.join(os.path.dirname(rec), target + ".bin"), cfg.image_size)
    accuracy = score(embed_pairs(backbone, images), issame).accuracy
    print(f"  yardstick {target} accuracy {accuracy:.4f}, {speed or 0:.1f} samples/s", flush=True)
    return losses, {target: accuracy}, speed


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


def speed_table(sample_fc_speeds, yardstick_speeds):
    """(lines of the table: run, both sides' samples/s, their ratio; the median ratio or None).
    A side that did not run or measure has None (and its run no ratio)."""
    lines = [f"  {'run':>3}  {'sample_fc':>10}  {'yardstick':>10}  {'ratio':>6}"]
    ratios = []
    for run, (ours, theirs) in enumerate(zip(sample_fc_speeds, yardstick_speeds), start=1):
        ratio = ours / theirs if ours and theirs else None
        if ratio is not None:
            ratios.append(ratio)
        cells = [f"{v:10.1f}" if v else f"{'-':>10}" for v in (ours, theirs)]
        lines.append(f"  {run:3d}  {cells[0]}  {cells[1]}  " + (f"{ratio:6.3f}" if ratio else f"{'-':>6}"))
    return lines, (statistics.median(ratios) if ratios else None)


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
    lines, median = speed_table(speeds.get("sample_fc", missing), speeds.get("yardstick", missing))
    print("\n".join(lines))
    if median is not None:
        print(f"  median ratio sample_fc / yardstick: {median:.3f}")


def train_both(args, order, curves, accuracies, speeds):
    """One training of each side (in `order`), results appended to the per-side lists."""
    for name in order:
        if name == "sample_fc":
            with tempfile.TemporaryDirectory(prefix="compare-") as models_root:
                result = run_sample_fc(args, models_root)
        else:
            result = run_torch(args, config(args))
        for table, value in zip((curves, accuracies, speeds), result):
            table.setdefault(name, []).append(value)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = config(args)                   # builds the demo data on first use, as train.py does
    sides = [{"sample_fc": "sample_fc", "torch": "yardstick"}[args.only]] if args.only else ["sample_fc", "yardstick"]
    layouts = {"sample_fc": sample_fc_layout(args, cfg)}
    if "yardstick" in sides:
        try:
            import torch
        except ImportError:
            sys.exit("compare: PyTorch is not installed; run `scripts/test.sh -k yardstick` once (the test script installs torch 2.13.0, CPU build, and its pinned dependencies: requirements-test.txt)")
        args.torch_threads = torch.get_num_threads()      # torch's default, before mxnet is imported here
        refusal = yardstick_refusal(cfg)
        if refusal:
            sys.exit(f"compare: {refusal}")
        layouts["yardstick"] = f"1 process x {args.torch_threads} torch threads; {yardstick_data_layout(args.torch_data)}"
    trainings = [(seed, run) for seed in (args.seeds or [cfg.seed]) for run in range(1, args.runs + 1)]
    base_overrides = list(args.overrides)
    curves, accuracies, speeds = {}, {}, {}
    for index, (seed, run) in enumerate(trainings):
        args.overrides = base_overrides + ([f"seed={seed}"] if args.seeds else [])
        print(f"\n== seed {seed}, run {run}", flush=True)
        train_both(args, sides if index % 2 == 0 else sides[::-1], curves, accuracies, speeds)
    report(curves, accuracies, speeds, trainings, {name: layouts[name] for name in sides})
    return 0


if __name__ == "__main__":
    sys.exit(main())
