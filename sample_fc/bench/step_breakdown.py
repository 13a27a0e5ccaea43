"""Where a CPU training step's time goes: sample_fc's step by stage beside the PyTorch
reference's forward, backward and update, on the same network, image size and global batch.

    .venv/bin/python -m sample_fc.bench.step_breakdown [--networks mbf,mbf_small] [--sizes 32,112]
        [--worlds 1,2] [--global-batch 128] [--steps 8] [--no-torch]

Each sample_fc case is a job of its own (`python -m sample_fc.bench --worker step` on `world`
ranks under horovodrun, cores // world threads each, as ./horovodrun.sh sets them): the real
module (builder.build_module: the backbone as training runs it, the full-softmax head) on the
demo's images resized to the case's size, read by FaceRecordIter as train.py reads them.
`step` is the median of plain module.step calls (with the data wait before each); the stage
columns are the median of steps timed stage by stage with every MXNet operation finished at
both ends (bench.cases.StageTimer), so they add up to a little more than `step`. The
reference runs in this process with all cores (as bench.compare runs it).
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

from .jobs import run_worker

STAGE_COLUMNS = (("data", ("data",)), ("forward", ("forward",)),
                 ("head", ("allgather", "sample", "gather_rows", "logits", "softmax", "gradients",
                           "reducescatter")),
                 ("backward", ("backbone_backward",)), ("finite check", ("finite_check",)),
                 ("update", ("gradient_sum", "bank_update", "backbone_update")))


def step_case(network, image_size, batch_size, steps, seed=0):
    """Measure module.step of `network` on this rank (a worker under horovodrun); the record."""
    import mxnet as mx
    from default import get_config
    from .. import builder, dist
    from ..data.demo import ensure_demo
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


def torch_case(network, image_size, global_batch, steps, classes=200, embedding_size=128):
    """The PyTorch reference's forward, backward (loss included) and SGD update, medians in ms."""
    import torch
    import torch.nn.functional as F
    from . import torch_reference
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    model = torch_reference.network(network, embedding_size, image_size)
    centers = torch.nn.Parameter(torch.randn(classes, embedding_size) * 0.01)
    optimizer = torch.optim.SGD(list(model.parameters()) + [centers], lr=0.1, momentum=0.9, weight_decay=5e-4)
    pixels = torch.rand(global_batch, 3, image_size, image_size) * 255
    labels = torch.randint(0, classes, (global_batch,))
    times = {"forward": [], "backward": [], "update": []}
    for i in range(steps + 3):
        start = time.perf_counter()
        cosine = F.linear(F.normalize(model(pixels)), F.normalize(centers))
        loss = F.cross_entropy(torch_reference.margin_logits(cosine, labels, 32.0, 1.0, 0.0, 0.25), labels)
        middle = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        after = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        end = time.perf_counter()
        if i >= 3:
            for name, seconds in (("forward", middle - start), ("backward", after - middle), ("update", end - after)):
                times[name].append(seconds)
    medians = {name: float(np.median(values) * 1e3) for name, values in times.items()}
    step_ms = sum(medians.values())
    return {"step_ms": step_ms, "samples_per_s": global_batch / step_ms * 1e3, "stages": medians}


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
    import default
    networks = args.networks.split(",")
    unknown = [n for n in networks if n not in default.NETWORKS]
    if unknown:
        parser.error(f"--networks: unknown {', '.join(unknown)}; choose from {', '.join(default.NETWORKS)}")
    try:
        sizes, worlds = [int(v) for v in args.sizes.split(",")], [int(v) for v in args.worlds.split(",")]
    except ValueError:
        parser.error(f"--sizes and --worlds are comma-separated integers, got {args.sizes!r} and {args.worlds!r}")
    if any(size <= 0 or size % 16 for size in sizes):
        parser.error(f"--sizes must be positive multiples of 16 (the backbones' strides), got {args.sizes}")
    if any(world < 1 or args.global_batch % world for world in worlds) or args.steps < 1:
        parser.error(f"--worlds must divide --global-batch {args.global_batch} and --steps be >= 1")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sample_fc.bench.step_breakdown", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", default="mbf,mbf_small")
    parser.add_argument("--sizes", default="32,112")
    parser.add_argument("--worlds", default="1,2")
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per case (plain and staged each)")
    parser.add_argument("--no-torch", action="store_true", help="sample_fc only")
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
            if not args.no_torch:
                record = torch_case(network, size, args.global_batch, args.steps)
                stages = record["stages"]
                rows.append([network, size, "PyTorch", f"1 x {os.cpu_count()}", f"{record['step_ms']:.0f}",
                             rate(record['samples_per_s']), "-", f"{stages['forward']:.0f}", "(in forward)",
                             f"{stages['backward']:.0f}", "-", f"{stages['update']:.0f}"])
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
