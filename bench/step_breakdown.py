"""Where a CPU training step's time goes: sample_fc's step by stage beside the yardstick's
(arcface_torch's step, bench/yardstick/), on the same network, image size and global batch.

    .venv/bin/python -m bench.step_breakdown [--networks mbf,r50] [--sizes 32,112]
        [--worlds 1,2] [--global-batch 128] [--steps 8] [--no-torch]
        [--torch-data rec|memory] [--torch-rec DIR ...]

Each sample_fc case is a job of its own (`python -m bench --worker step` on `world`
ranks under horovodrun, cores // world threads each, as ./horovodrun.sh sets them): the real
module (builder.build_module: the backbone as training runs it, the full-softmax head) on the
demo's images resized to the case's size, read by FaceRecordIter as train.py reads them.
`step` is the median of plain module.step calls (with the data wait before each); the stage
columns are the median of steps timed stage by stage with every MXNet operation finished at
both ends (bench.cases.StageTimer), so they add up to a little more than `step`.

The yardstick row (per network and size) runs in this process with torch's default threads:
arcface_torch's network (mbf, r18..r200; none for sample_fc's other networks), PartialFC_V2
at sample rate 1 with the demo recipe's classes, embedding size and CosFace margin, SGD, clip
5, the global batch on one process. Its data is the .rec of the case's size (the demo's at
32 px, or a --torch-rec folder: its property file names the size) decoded per step by its
2-worker DataLoader; with --torch-data memory, or with no .rec of that size, images held in
memory (the trainer cell says which). `step` is the median of its steps' totals. The row
"tuned" beside it is the same step as a skilled PyTorch user runs it on a CPU
(yardstick/tuned.py: channels-last model and batches, images held in memory).

What each column counts, sample_fc | yardstick:
    data          wait for the batch: FaceRecordIter (decode, resize, copy) | the loader's queue or the gather
    forward       backbone forward | backbone forward
    head          allgather of embeddings and labels, sampling, logits, softmax, the head's
                  gradients, reduce-scatter (the collectives) | PartialFC forward: logits, margin, loss
    backward      backbone backward | all of backward (the head's and the backbone's)
    check/clip    finite check of the gradients | clip_grad_norm_ of the backbone's
    update        gradient sum over ranks (a collective) with clipping, bank and backbone SGD |
                  SGD step, zero_grad, lr
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

from sample_fc.config import scaled_lr
from .jobs import run_worker

STAGE_COLUMNS = (("data", ("data",)), ("forward", ("forward",)),
                 ("head", ("allgather", "sample", "gather_rows", "logits", "softmax", "gradients",
                           "reducescatter")),
                 ("backward", ("backbone_backward",)), ("check/clip", ("finite_check",)),
                 ("update", ("gradient_sum", "bank_update", "backbone_update")))


def step_case(network, image_size, batch_size, steps, seed=0):
    """Measure module.step of `network` on this rank (a worker under horovodrun); the record."""
    import mxnet as mx
    from sample_fc.config import get_config
    from sample_fc import builder, dist
    from sample_fc.data.demo import ensure_demo
    from .cases import STAGES, StageTimer, median_ms, staged_step
    from .jobs import REPO
    dist.init(on_cpu=True)
    rank, world = dist.rank(), dist.size()
    cfg = get_config("demo", network=network)
    cfg.rec = os.path.join(REPO, cfg.rec)
    ensure_demo(os.path.dirname(cfg.rec))
    cfg.image_size, cfg.batch_size, cfg.sample_ratio, cfg.seed = image_size, batch_size, 1.0, seed
    train_iter = builder.build_iterator(cfg, rank, world)
    module = builder.build_module(cfg, builder.build_symbol(cfg), rank, world, mx.cpu(), mx.cpu())

    def next_batch():
        try:
            return train_iter.next()
        except StopIteration:
            train_iter.reset()
            return train_iter.next()
    for _ in range(3):                                  # oneDNN primitives, first allocations
        module.step(next_batch())
    mx.nd.waitall()
    plain, data, staged = [], [], {name: [] for name in STAGES}
    for _ in range(steps):
        start = time.perf_counter()
        batch = next_batch()
        data.append(time.perf_counter() - start)
        start = time.perf_counter()
        module.step(batch)
        mx.nd.waitall()
        plain.append(time.perf_counter() - start)
        timer = StageTimer()
        staged_step(module, next_batch(), timer)
        for name in STAGES:
            staged[name].append(timer.seconds.get(name, 0.0))
    train_iter.close()
    stages = {name: median_ms(values) for name, values in staged.items()}
    stages["data"] = median_ms(data)
    step_ms = median_ms(plain) + stages["data"]
    return {"rank": rank, "world": world, "network": network, "image_size": image_size,
            "threads": int(os.environ.get("OMP_NUM_THREADS", "0")), "step_ms": step_ms,
            "samples_per_s": batch_size * world / step_ms * 1e3, "stages": stages}


def rec_side_and_classes(folder):
    """(image side, classes) from a .rec folder's property file (data.recordio.read_property), or
    None when it has none or it does not read."""
    from sample_fc.data.recordio import read_property
    from sample_fc.errors import UsageError
    try:
        found = read_property(folder)
    except (OSError, UsageError):
        return None
    return (found[1], found[0]) if found else None


def rec_for_size(folders, image_size, num_classes):
    """The first folder holding a .rec of `image_size` px images with at most num_classes labels, or None."""
    for folder in folders:
        found = rec_side_and_classes(folder)
        if found and found[0] == image_size and found[1] <= num_classes:
            return folder
    return None


def yardstick_case(network, image_size, global_batch, steps, data, rec_folders, tuned=False):
    """The yardstick's step by stage (yardstick.stages) on the demo recipe's head: medians in ms,
    the data it read and its threads; `tuned`: channels-last model and batches from memory."""
    import torch
    threads = torch.get_num_threads()        # torch's default; importing mxnet (the .rec reader) leaves 1
    import mxnet  # noqa: F401
    from sample_fc.config import get_config
    from .yardstick import CombinedMargin, MemoryFaces, PartialFC, RecFaces, Trainer, build_network, rec_loader
    from .yardstick.data import LOADER_WORKERS, Prefetched
    from .yardstick.stages import stage_medians
    from .yardstick.tuned import channels_last, channels_last_batches
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = get_config("demo", network=network)
    lr = scaled_lr(cfg, global_batch)
    head = PartialFC(CombinedMargin(cfg.loss_s, cfg.loss_m1, cfg.loss_m2, cfg.loss_m3), cfg.embedding_size,
                     cfg.num_classes)
    backbone = build_network(network, image_size, cfg.embedding_size)
    trainer = Trainer(channels_last(backbone) if tuned else backbone, head, lr, cfg.wd)
    folder = rec_for_size(rec_folders, image_size, cfg.num_classes) if data == "rec" and not tuned else None
    if folder:              # the loader last: its workers fork while nothing else runs here
        loader = Prefetched(rec_loader(RecFaces(folder), global_batch, LOADER_WORKERS))
        source, batches, close = f"rec, {LOADER_WORKERS} loader workers", loader, loader.close
    else:
        faces = MemoryFaces.random(max(4 * global_batch, 512), image_size, cfg.num_classes)
        source, batches, close = "memory", faces.batches(global_batch), (lambda: None)
    if tuned:
        source, batches = "memory, channels-last", channels_last_batches(batches)
    stages = stage_medians(trainer, batches, steps)
    close()
    return {"step_ms": stages.pop("step"), "stages": stages, "source": source, "threads": torch.get_num_threads()}


def rate(samples_per_s):
    return f"{samples_per_s:.1f}" if samples_per_s < 100 else f"{samples_per_s:.0f}"


def table(rows):
    head = ["network", "px", "trainer", "workers x threads", "step ms", "samples/s"] + [c for c, _ in STAGE_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


def check_args(parser, args):
    """One line (argparse's, exit 2) for a case that cannot run, before any job starts."""
    from sample_fc.config import NETWORKS
    networks = args.networks.split(",")
    unknown = [n for n in networks if n not in NETWORKS]
    if unknown:
        parser.error(f"--networks: unknown {', '.join(unknown)}; choose from {', '.join(NETWORKS)}")
    if not args.no_torch:
        from .yardstick.networks import NETWORKS as YARDSTICK_NETWORKS
        missing = [n for n in networks if n not in YARDSTICK_NETWORKS]
        if missing:
            parser.error(f"--networks: the yardstick has no {', '.join(missing)}; arcface_torch's networks it has: "
                         f"{', '.join(YARDSTICK_NETWORKS)} (or --no-torch for sample_fc rows only)")
    try:
        sizes, worlds = [int(v) for v in args.sizes.split(",")], [int(v) for v in args.worlds.split(",")]
    except ValueError:
        parser.error(f"--sizes and --worlds are comma-separated integers, got {args.sizes!r} and {args.worlds!r}")
    if any(size <= 0 or size % 16 for size in sizes):
        parser.error(f"--sizes must be positive multiples of 16 (the backbones' strides), got {args.sizes}")
    if any(world < 1 or args.global_batch % world for world in worlds) or args.steps < 1:
        parser.error(f"--worlds must divide --global-batch {args.global_batch} and --steps be >= 1")


def yardstick_row(args, network, size, tuned=False):
    """The table row of the yardstick's step for `network` at `size` px (`tuned`: the row "tuned")."""
    from .jobs import REPO
    demo = os.path.join(REPO, "data", "demo")
    record = yardstick_case(network, size, args.global_batch, args.steps, args.torch_data, args.torch_rec + [demo],
                            tuned)
    stages = record["stages"]
    return ([network, size, f"{'tuned' if tuned else 'yardstick'} ({record['source']})", f"1 x {record['threads']}",
             f"{record['step_ms']:.0f}", rate(args.global_batch / record["step_ms"] * 1e3)]
            + [f"{stages[name]:.0f}" for name in ("data", "forward", "head", "backward", "clip", "update")])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.step_breakdown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", default="mbf,r50")
    parser.add_argument("--sizes", default="32,112")
    parser.add_argument("--worlds", default="1,2")
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per case (plain and staged each)")
    parser.add_argument("--no-torch", action="store_true", help="sample_fc only (no yardstick rows)")
    parser.add_argument("--torch-data", choices=("rec", "memory"), default="rec",
                        help="yardstick: a .rec of the case's size read by its DataLoader (default; memory where "
                        "there is none), or images held in memory")
    parser.add_argument("--torch-rec", action="append", default=[], metavar="DIR",
                        help="yardstick: a folder with train.rec/.idx/property of another size (repeatable; "
                        "the demo's serves 32 px)")
    args = parser.parse_args(argv)
    check_args(parser, args)
    rows = []
    folder = tempfile.mkdtemp(prefix="step-breakdown-")
    for network in args.networks.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            for world in (int(w) for w in args.worlds.split(",")):
                options = {"network": network, "image_size": size, "batch": args.global_batch // world,
                           "steps": args.steps}
                ranks, error = run_worker("step", options, world, 1800, folder)
                if error:
                    sys.exit(f"step_breakdown: {network} {size} px on {world} workers failed: {error}")
                slowest = max(ranks, key=lambda r: r["step_ms"])
                cells = [f"{sum(slowest['stages'].get(s, 0.0) for s in names):.0f}" for _, names in STAGE_COLUMNS]
                rows.append([network, size, "sample_fc", f"{world} x {slowest['threads']}", f"{slowest['step_ms']:.0f}",
                             rate(args.global_batch / slowest['step_ms'] * 1e3)] + cells)
                print(table(rows[-1:]).splitlines()[-1], flush=True)
            for tuned in ((False, True) if not args.no_torch else ()):
                rows.append(yardstick_row(args, network, size, tuned))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
