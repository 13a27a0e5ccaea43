"""What a run needs per worker, and whether a cluster holds it, before anything is allocated.

    python -m sample_fc.tools.plan [--dataset D] [--network N] [--loss L] [--set key=value ...]
        -np WORKERS [--workers-per-node K] [--memory-per-node GB | --gpu-memory GB]

Prints, per worker: the bank's bytes, the sampler's, the head step's temporaries, an estimate
of the backbone's (parameters, gradients, momentum and the activations of a batch), the
runtime, their total; the classes per worker, rows sampled per step, allgather bytes per step
and the size of one checkpoint; then whether it fits. Host memory: --memory-per-node (default:
this machine's MemAvailable) shared by the node's workers; --gpu-memory: the bank, the head
and the backbone on each worker's GPU (bank_context=same), or only the backbone there and
the bank in host memory (bank_context=cpu). train.py runs the same arithmetic at start-up
(sample_fc.memory_plan) and refuses a run that does not fit.
"""
import os
import sys

from ..errors import UsageError
from . import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_parser():
    parser = cli.make_parser("sample_fc.tools.plan", __doc__)
    parser.add_argument("--dataset", default="demo", help="dataset preset (default demo)")
    parser.add_argument("--network", default=None, help="network preset (default: the dataset's)")
    parser.add_argument("--loss", default=None, help="loss preset (default: the dataset's recipe)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable), as train.py --set")
    parser.add_argument("-np", "--num-proc", dest="world", type=int, required=True, help="workers in all")
    parser.add_argument("--workers-per-node", type=int, default=None,
                        help="workers sharing one node's memory (default: all of them)")
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument("--memory-per-node", type=float, default=None, metavar="GB",
                        help="host memory per node in GB (default: this machine's MemAvailable)")
    memory.add_argument("--gpu-memory", type=float, default=None, metavar="GB",
                        help="memory of each worker's GPU in GB (the backbone trains there)")
    return parser


def verdict(the_plan, available, sharing, where):
    """'fits' or 'does not fit' with the numbers, for `available` bytes shared by `sharing`."""
    from ..memory_plan import GB
    share = available / sharing
    word = "fits" if the_plan.total <= share else "does NOT fit"
    return (f"{word}: {the_plan.total / GB:.2f} GB per worker of {share / GB:.2f} GB of {where} "
            f"({available / GB:.1f} GB shared by {sharing} worker(s))")


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)

    def work():
        sys.path.insert(0, ROOT)
        import default
        import symbols
        from .. import memory_plan
        from ..builder import check_world, resolve_auto, run_plan
        from ..partial_fc import PartialFCOptions
        from ..sampling_regime import regime
        from symbols.cost import backbone_cost
        from ..host_head import default_threads
        cfg = default.config_for_run(args.dataset, args.network, args.loss, args.overrides)
        if args.world < 1 or (args.workers_per_node or 1) < 1:
            raise UsageError(f"-np and --workers-per-node must be >= 1, got {args.world} and {args.workers_per_node}")
        check_world(cfg, args.world)
        auto = resolve_auto(cfg, args.world)
        per_node = min(args.workers_per_node or args.world, args.world)
        try:    # symbols checks what the config's type checks cannot (image_size a multiple of 16)
            symbol = symbols.get_symbol(cfg.network, cfg.embedding_size, cfg.image_size, "float32", cfg.dropout)
        except ValueError as err:
            raise UsageError(f"the config's backbone: {err}") from None
        on_gpu = args.gpu_memory is not None
        host, device = run_plan(cfg, args.world, symbol, on_gpu, cfg.bank_context == "same",
                                default_threads(per_node))
        warmup = PartialFCOptions.from_config(cfg).peak_ratio() > cfg.sample_ratio
        print(f"{cfg.dataset}, {cfg.network}: {cfg.num_classes:,} classes x {cfg.embedding_size} on "
              f"{args.world} worker(s), batch {cfg.batch_size} per worker, sample_ratio {cfg.sample_ratio}"
              + (f" after a {cfg.sample_ratio_warmup_steps}-step warm-up from {cfg.sample_ratio_warmup_start} "
                 f"(planned at {cfg.sample_ratio_warmup_start}: its first steps sample the most)" if warmup else ""))
        sampling = regime(cfg.sample_ratio, cfg.num_classes, args.world, cfg.batch_size, cfg.embedding_size,
                          backbone_cost(symbol, cfg.image_size).multiply_adds)
        if auto:
            print(auto)
        print(sampling.line())
        if sampling.warning():
            print(f"warning: {sampling.warning()}")
        for title, part in (("host memory, per worker", host), ("GPU memory, per worker", device)):
            if part is not None:
                print(f"\n{title}:")
                print("\n".join("  " + line for line in part.lines()))
        print()
        memory = args.memory_per_node * memory_plan.GB if args.memory_per_node else memory_plan.meminfo_available()
        if memory is not None:
            print(verdict(host, memory, per_node, "host memory"))
        if device is not None:
            print(verdict(device, args.gpu_memory * memory_plan.GB, 1, "GPU memory"))

    cli.run_or_exit(parser, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
