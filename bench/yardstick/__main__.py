"""`python -m bench.yardstick`: see bench/yardstick/__init__.py."""
import argparse
import statistics
import sys

import torch

from . import faithful, upstream
from .data import LOADER_WORKERS, MemoryFaces, Prefetched, RecFaces, rec_loader
from .networks import EMBEDDING_SIZE, NETWORKS, build_network
from .training import CombinedMargin, PartialFC, Trainer, distributed_backbone

BOUND = 0.05     # ours must train within 5% of arcface_torch's own samples/s, either way


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.yardstick",
                                     description="arcface_torch's training step, ours against its own files")
    parser.add_argument("--check-against", metavar="DIR", help="a checkout's recognition/arcface_torch: "
                        "check ours against its own modules and time both")
    parser.add_argument("--rec", metavar="DIR", help="folder with train.rec/.idx (default: random pixels)")
    parser.add_argument("--source", choices=("memory", "rec"), default="memory",
                        help="memory: decoded once, held normalised; rec: decoded per step by loader workers")
    parser.add_argument("--workers", type=int, default=LOADER_WORKERS, help="loader workers for --source rec")
    parser.add_argument("--images", type=int, help="hold at most this many images (--source memory)")
    parser.add_argument("--network", choices=NETWORKS, default="mbf")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=128, help="global batch (one process)")
    parser.add_argument("--steps", type=int, default=2, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=12, help="timed rounds per side, alternating (short rounds, "
                        "many of them: the ratio is the median of the rounds' ratios)")
    parser.add_argument("--sample-rate", type=float, default=1.0)
    parser.add_argument("--margins", default="1.0,0.0,0.25", help="m1,m2,m3: CosFace 0.25 by default; "
                        "arcface_torch's configs/base.py: ArcFace 1,0.5,0")
    parser.add_argument("--scale", type=float, default=64.0)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--ddp", action="store_true", help="wrap both backbones in DistributedDataParallel "
                        "with float16-compressed gradients, as train_v2.py does (one-process Gloo group)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own before mxnet is "
                        "imported; importing it, as their dataset.py does, leaves torch 1 thread)")
    args = parser.parse_args(argv)
    if args.source == "rec" and not args.rec:
        parser.error("--source rec needs --rec DIR")
    try:
        args.margins = tuple(float(m) for m in args.margins.split(","))
    except ValueError:
        parser.error(f"--margins {args.margins!r} is not three numbers m1,m2,m3")
    if len(args.margins) != 3:
        parser.error(f"--margins {args.margins} is not three numbers m1,m2,m3")
    if not 0 < args.sample_rate <= 1:
        parser.error(f"--sample-rate {args.sample_rate} is not in (0, 1]")
    try:
        CombinedMargin(args.scale, *args.margins)
    except ValueError as error:
        parser.error(f"--margins: {error}")
    if args.check_against and upstream.not_arcface_torch("--check-against", args.check_against):
        parser.error(upstream.not_arcface_torch("--check-against", args.check_against))
    return args


def memory_data(args):
    """Images held in memory: the .rec's (checked against the run's size and classes) or random."""
    if not args.rec:
        return MemoryFaces.random(max(4 * args.batch, 512), args.image_size, args.classes)
    faces = MemoryFaces.from_rec(args.rec, args.images)
    side = faces.images.shape[-1]
    if side != args.image_size:
        raise SystemExit(f"{args.rec} holds {side} px images, not --image-size {args.image_size}")
    if int(faces.labels.max()) >= args.classes:
        raise SystemExit(f"{args.rec} has label {int(faces.labels.max())}, beyond --classes {args.classes}")
    return faces


def batch_iterators(args):
    """What gives each side its batches: its own iterator over the same images in memory (the
    same sequence for every side), or the one loader both share."""
    if args.source == "memory":
        faces = memory_data(args)
        return lambda: faces.batches(args.batch)
    loader = Prefetched(rec_loader(RecFaces(args.rec), args.batch, args.workers))
    return lambda: loader


def describe_processes(args):
    threads = f"torch threads {torch.get_num_threads()} (inter-op {torch.get_num_interop_threads()})"
    if args.ddp:
        threads += ", backbones in DDP on a one-process Gloo group (its threads: Gloo's and DDP's reducer)"
    if args.source == "memory":
        return f"1 process, {threads}; data held in memory, no loader workers"
    return (f"1 process, {threads}; data: DataLoader with {args.workers} worker processes "
            "(1 torch thread each) and 1 prefetch thread, shared by both sides")


def print_checks(forward, step):
    print(f"forward: {forward['state_entries']} state entries mapped in order "
          f"({' -> '.join(forward['first_pair'])}, ..., {' -> '.join(forward['last_pair'])}); parameters "
          f"theirs {forward['params_theirs']:,}, ours {forward['params_ours']:,}; "
          f"max |diff| eval {forward['max_abs_eval']:.2e}, train {forward['max_abs_train']:.2e}")
    print(f"one step: loss theirs {step['loss_theirs']:.6f}, ours {step['loss_ours']:.6f} "
          f"(|diff| {step['loss_abs_diff']:.2e}); max |param diff| after the update "
          f"{step['max_abs_param_diff']:.2e} (centers {step['max_abs_center_diff']:.2e})")


def print_rates(rates, unit):
    for name, values in rates.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:>13}: median {statistics.median(values):.1f} {unit} (rounds: {rounds})")
    if len(rates) == 2:
        per_round = [o / t for o, t in zip(rates["ours"], rates["arcface_torch"])]
        ratio = statistics.median(per_round)
        verdict = "within" if abs(ratio - 1) <= BOUND else "NOT within"
        print(f"ours / arcface_torch in {unit}: median of rounds {ratio:.3f} (rounds: "
              f"{', '.join(f'{r:.3f}' for r in per_round)}); {verdict} 5% of theirs")


def wrapper(args):
    return distributed_backbone if args.ddp else (lambda backbone: backbone)


def their_runner(args, margin, our_net, batches):
    """Check ours against arcface_torch's own modules, print the checks; their trainer."""
    modules = upstream.load(args.check_against)
    their_net = upstream.build_network(modules, args.network, args.image_size)
    forward = faithful.forward_check(their_net, our_net, args.image_size)
    images, labels = next(batches)
    step = faithful.step_check(modules, their_net, our_net, images, labels, args.classes,
                               args.sample_rate, margin, args.lr, args.weight_decay, wrapper(args))
    print_checks(forward, step)
    return upstream.UpstreamTrainer(modules, wrapper(args)(their_net), args.classes, args.sample_rate, margin,
                                    args.lr, args.weight_decay)


def main(argv=None):
    args = parse_args(argv)
    default_threads = torch.get_num_threads()
    torch.manual_seed(0)
    margin = CombinedMargin(args.scale, *args.margins)
    new_batches = batch_iterators(args)
    # importing mxnet (theirs: dataset.py, at import) drops torch to 1 thread: set them again
    torch.set_num_threads(args.threads or default_threads)
    print(f"{args.network} at {args.image_size} px, {args.classes} classes, batch {args.batch}, "
          f"sample rate {args.sample_rate}, margins {args.margins} s {args.scale}, lr {args.lr}, "
          f"weight decay {args.weight_decay}{', DDP' if args.ddp else ''}, "
          f"data {args.source}{' from ' + args.rec if args.rec else ' (random)'}")
    print(describe_processes(args))
    our_net = build_network(args.network, args.image_size)
    runners = {}
    if args.check_against:
        runners["arcface_torch"] = (their_runner(args, margin, our_net, new_batches()), new_batches())
    head = PartialFC(margin, EMBEDDING_SIZE, args.classes, args.sample_rate)
    runners["ours"] = (Trainer(wrapper(args)(our_net), head, args.lr, args.weight_decay), new_batches())
    wall, cpu = faithful.alternate_timing(runners, args.batch, args.steps, args.rounds)
    print(f"timing: {args.rounds} rounds x {args.steps} steps per side, 2 warm-up steps each, "
          f"torch threads {torch.get_num_threads()}")
    print_rates(wall, "samples/s")
    print_rates(cpu, "samples per CPU-s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
