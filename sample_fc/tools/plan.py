"""What a run needs per worker, and whether a cluster holds it, before anything is allocated.

    python -m sample_fc.tools.plan [--dataset D] [--network N] [--loss L] [--set key=value ...]
        -np WORKERS [--workers-per-node K] [--memory-per-node GB] [--gpu-memory GB] [--models-root DIR]

Prints, per worker: the bank's bytes, the sampler's, the head step's temporaries, an estimate
of the backbone's (parameters, gradients, momentum and the activations of a batch), the
runtime, their total; the classes per worker, rows sampled per step, allgather bytes per step
and the size of one checkpoint; then whether it fits. Host memory: --memory-per-node GB shared
by the node's workers (default: this machine's MemAvailable, unless --gpu-memory describes
another node: then host memory is checked only with --memory-per-node); --gpu-memory: the
bank, the head and the backbone on each worker's GPU (bank_context=same), or only the
backbone there and the bank in host memory (bank_context=cpu). What does not fit comes with
the ways out train.py lists (more workers, bank_dtype=float16, bank_momentum=int8, 8-bit centers
(bank_dtype=int8 with bank_momentum=none), the bank on the host, the sampling warm-up started at
the ratio, a smaller batch: each with the GB per worker it gives) and exit code 2. A bank in host
memory on GPUs also says the bytes crossing GPU <-> host per step. The bank's
storage is the config's: `--set bank_dtype=float16 --set bank_momentum=int8` plans that bank. A warning says when the
checkpoints would not fit the free disk of the models root (--models-root, default train.py's
models/<dataset>_<network>). train.py runs the same arithmetic at start-up
(sample_fc.run.memory_plan) and refuses a run that does not fit.
"""
import os
import sys

from ..errors import USAGE_EXIT, UsageError
from . import cli



def make_parser():
    parser = cli.make_parser("sample_fc.tools.plan", __doc__)
    parser.add_argument("--dataset", default=None, help="dataset preset (default demo)")
    parser.add_argument("--network", default=None, help="network preset (default: the dataset's)")
    parser.add_argument("--loss", default=None, help="loss preset (default: the dataset's recipe)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="an experiment file of `key = value` lines, as train.py --config")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable, after --config's lines), as train.py --set")
    parser.add_argument("-np", "--num-proc", dest="world", type=int, required=True, help="workers in all")
    parser.add_argument("--workers-per-node", type=int, default=None,
                        help="workers sharing one node's memory (default: all of them)")
    parser.add_argument("--memory-per-node", type=float, default=None, metavar="GB",
                        help="host memory per node in GB (default: this machine's MemAvailable, "
                             "not checked with --gpu-memory alone)")
    parser.add_argument("--gpu-memory", type=float, default=None, metavar="GB",
                        help="memory of each worker's GPU in GB (the backbone trains there)")
    parser.add_argument("--models-root", default=None, metavar="DIR",
                        help="where the checkpoints would go, for the disk check (default: "
                             "models/<dataset>_<network>, as train.py)")
    return parser


def verdict(the_plan, available, sharing, where):
    """(fits, 'fits' or 'does NOT fit' with the numbers) for `available` bytes shared by `sharing`."""
    from ..run.memory_plan import GB
    share = available / sharing
    fits = the_plan.total <= share
    return fits, (f"{'fits' if fits else 'does NOT fit'}: {the_plan.total / GB:.2f} GB per worker of "
                  f"{share / GB:.2f} GB of {where} ({available / GB:.1f} GB shared by {sharing} worker(s))")


def disk_lines(the_plan, keep, models_root):
    """The checkpoints against the free disk of models_root: a line, and a warning when one
    checkpoint, or the `keep` kept plus the one being written, would not fit."""
    from ..checkpoint import free_bytes
    from ..run.memory_plan import GB
    free, one = free_bytes(models_root), the_plan.checkpoint
    lines = [f"disk: one checkpoint {one / GB:.2f} GB, ckpt_keep={keep} kept plus one being written "
             f"{(keep + 1) * one / GB:.2f} GB; {free / GB:.1f} GB free at {models_root}"]
    if one > free:
        lines.append(f"warning: one checkpoint ({one / GB:.1f} GB) does not fit the {free / GB:.1f} GB free at "
                     f"{models_root}: train.py refuses to start there; free space or choose another --models-root")
    elif (keep + 1) * one > free:
        lines.append(f"warning: ckpt_keep={keep} checkpoints plus the one being written "
                     f"({(keep + 1) * one / GB:.1f} GB) "
                     f"do not fit the {free / GB:.1f} GB free at {models_root}: a save will fail when the disk is "
                     f"full; lower ckpt_keep or choose another --models-root")
    return lines


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)

    def work():
        from .. import config
        from ..run import memory_plan
        from ..builder import build_symbol, centers_line, check_world, complete_from_data, resolve_auto, target_paths
        from ..data.bin_format import read_bin
        from ..run.run_request import default_models_root
        from ..pfc.partial_fc import PartialFCOptions
        from ..pfc.sampling_regime import regime
        from ..symbols.cost import backbone_cost
        from ..pfc.head import default_threads
        from ..run.experiment_file import read_experiment
        if args.config:
            read_experiment(args.config).merged_into(args)
        cfg = complete_from_data(config.config_for_run(args.dataset, args.network, args.loss, args.overrides),
                                 args.overrides, lambda line: print(line, file=sys.stderr))   # as train.py
        if args.world < 1 or (args.workers_per_node or 1) < 1:
            raise UsageError(f"-np and --workers-per-node must be >= 1, got {args.world} and {args.workers_per_node}")
        check_world(cfg, args.world)
        auto = resolve_auto(cfg, args.world)
        per_node = min(args.workers_per_node or args.world, args.world)
        try:    # symbols checks what the config's type checks cannot (image_size a multiple of 16)
            symbol = build_symbol(cfg)          # train.py's: float16 with fp16, the learned embedding scale
        except ValueError as err:
            raise UsageError(f"the config's backbone: {err}") from None
        on_gpu, bank_on_gpu, threads = (args.gpu_memory is not None, cfg.bank_context == "same",
                                        default_threads(per_node))
        for name, value in (("--memory-per-node", args.memory_per_node), ("--gpu-memory", args.gpu_memory)):
            if value is not None and not value > 0:
                raise UsageError(f"{name} must be a positive number of GB, got {value:g}")
        found = {name: path for name, path in target_paths(cfg).items() if os.path.isfile(path)}
        images = sum(len(read_bin(path)[0]) for path in found.values())        # uint8 as train.py holds them
        targets = images * 3 * cfg.image_size ** 2
        host, device = memory_plan.run_plan(cfg, args.world, symbol, on_gpu, bank_on_gpu, threads, targets)
        warmup = PartialFCOptions.from_config(cfg).peak_ratio() > cfg.sample_ratio
        print(f"{cfg.dataset}, {cfg.network}: {cfg.num_classes:,} classes x {cfg.embedding_size} on "
              f"{args.world} worker(s), batch {cfg.batch_size} per worker, sample_ratio {cfg.sample_ratio}"
              + (f" after a {cfg.sample_ratio_warmup_steps}-step warm-up from {cfg.sample_ratio_warmup_start} "
                 f"(planned at {cfg.sample_ratio_warmup_start}: its first steps sample the most)" if warmup else ""))
        sampling = regime(cfg.sample_ratio, cfg.num_classes, args.world, cfg.batch_size, cfg.embedding_size,
                          backbone_cost(symbol, cfg.image_size).multiply_adds)
        if auto.get("sample_ratio"):
            print(auto["sample_ratio"])
        missing = sorted(set(cfg.val_targets) - set(found))
        print(f"verification: {images:,} images of {', '.join(found)} ({targets / 1e9:.2f} GB) planned"
              if found else "verification: none planned (no val_targets found beside the data here)")
        if found and missing:
            print(f"verification: {', '.join(missing)} not found beside the data here: not planned")
        print(sampling.line())
        if sampling.warning():
            print(f"warning: {sampling.warning()}")
        print(centers_line(cfg, args.world, auto))
        for title, part in (("host memory, per worker", host), ("GPU memory, per worker", device)):
            if part is not None:
                print(f"\n{title}:")
                print("\n".join("  " + line for line in part.lines()))
        print()
        checks = []             # (part, plan, bytes, workers sharing them, where)
        if args.memory_per_node is not None:
            checks.append((0, host, args.memory_per_node * memory_plan.GB, per_node, "host memory"))
        elif on_gpu:
            print("host memory: not checked (--gpu-memory describes another node; give its --memory-per-node GB)")
        elif memory_plan.meminfo_available() is not None:
            checks.append((0, host, memory_plan.meminfo_available(), per_node, "this machine's available host memory"))
        if device is not None:
            checks.append((1, device, args.gpu_memory * memory_plan.GB, 1, "GPU memory"))
        failed = False
        for part, the_plan, available, sharing, where in checks:
            fits, line = verdict(the_plan, available, sharing, where)
            print(line)
            if not fits:
                failed = True
                ways = memory_plan.plan_ways_out(cfg, args.world, symbol, on_gpu, bank_on_gpu, threads, part,
                                                 targets)(available / sharing)
                print("\n".join(f"  way out: {way}" for way in ways + [memory_plan.OTHER_WAYS]))
        print("\n".join(disk_lines(host, cfg.ckpt_keep, args.models_root or default_models_root(cfg))))
        return failed

    failed = cli.run_or_exit(parser, work)
    return USAGE_EXIT if failed else 0


if __name__ == "__main__":
    sys.exit(main())
