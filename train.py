"""Train a face-recognition embedding with Partial FC on Horovod workers.

    horovodrun -np 8 -H localhost:8 python train.py --dataset emore --network r100 --loss arcface \\
        --models-root models/r100 [--set key=value ...] [--resume models/r100]

With no arguments it trains the demo (built on first use in data/demo/). Every rank runs
this; rank 0 owns the models root while the job runs (its lock), logs, and writes config.json,
status.json and the backbone of each checkpoint. A mistake in the command, the config, the
data, a checkpoint or the models root ends the job with one line and exit code 2, before
anything is written to the models root; any other failure keeps its traceback (exit 1).
"""
import argparse
import json
import os
import sys
import time

from sample_fc.ranks import share_cores

share_cores()                 # before mxnet starts its threads: cores // workers on this node

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from sample_fc.symbols import get_symbol
from sample_fc.symbols.cost import backbone_cost, network_table
from sample_fc import builder, checkpoint, dist
from sample_fc.run import layout, resume, run_root
from sample_fc.checkpoint import CheckpointError
from sample_fc import config
from sample_fc.config import format_config, save_config
from sample_fc.data.demo import ensure_demo
from sample_fc.run.experiment_file import read_experiment
from sample_fc.errors import ERROR_PREFIX, FAILURE_EXIT, USAGE_EXIT, UsageError, mxnet_reason
from sample_fc.module import NonFiniteError
from sample_fc.ranks import launcher_rank
from sample_fc.run.run_events import RunEvents, end_at_once
from sample_fc.run.run_request import RunRequest, RunStatus
from sample_fc.run.stop import StopSignals
from sample_fc.run.watchdog import StepWatchdog

SHUTDOWN_GRACE_S = 3    # a rank stopped by another's failure exits this much later, so the
                        # launcher reports the failing rank's exit code, not the waiting one's


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        """Usage and config mistakes: one line from the first rank only, exit 2."""
        fail(f"{message} (see train.py --help)", USAGE_EXIT, print_it=launcher_rank() == 0)

    def format_help(self):
        """The help, ending with every network's size and cost: built here, when help is asked
        for, not on every start (it builds every network's symbol)."""
        self.epilog = ("networks (--network) per image at 112 px, D 512 (multiply-adds grow with the "
                       "image's area):\n  " + "\n  ".join(network_table(112, 512)))
        return super().format_help()


def fail(message, code, print_it=True, status=None):
    """Exit with one error line. Only the rank that prints exits non-zero; the others exit 0
    right away, so the launcher (mpirun, horovodrun) never stops the job on a silent rank
    before the printing rank's line has reached the terminal, and reports the printer's code.
    Once Horovod runs, the exit skips interpreter teardown (os._exit): MXNet's engine, the
    decode threads and Horovod's thread may still be busy, and tearing down under them can
    crash ("corrupted size vs. prev_size") and replace the exit code. `status`, the job's
    RunStatus once the run may have started: rank 0 of a started run records the failure there."""
    if status is not None:
        status.failed(message)
    if print_it:
        print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)
    code = code if print_it else 0
    if dist.is_started():
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)


def make_parser():
    parser = OneLineParser(prog="train.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=None, choices=config.DATASETS, help="default: demo")
    parser.add_argument("--network", "--net", default=None, choices=config.NETWORKS,
                        help="backbone (sizes and costs below); default: the dataset's (the demo's is mbf_small, "
                             "every other's mbf)")
    parser.add_argument("--loss", default=None, choices=config.LOSSES,
                        help="margins as published (the demo also warms ArcFace's lr up: sample_fc/config/presets.py); "
                             "default: the dataset's recipe")
    parser.add_argument("--models-root", default=None,
                        help="output dir (default: models/<dataset>_<network>; with --resume, that run's)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="an experiment file: `key = value` lines (what --set takes; dataset, network "
                             "and loss choose presets), applied before the command line's own options")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable; after --config's lines); each is explained in "
                             "docs/training.md, Key reference")
    parser.add_argument("--resume", default=None, metavar="DIR",
                        help="continue a run: a checkpoint dir, or a models root (its newest sound "
                             "checkpoint); the run keeps its config (see sample_fc/config/older_runs.py)")
    parser.add_argument("--pretrained", default=None, metavar="PREFIX[,EPOCH]",
                        help="start from a trained backbone's weights (a prefix as for "
                             "mx.model.load_checkpoint, a checkpoint dir, a models root, "
                             "arcface_torch's backbone.pth of this --network, or an ONNX model that "
                             "maps onto it); the class centers "
                             "and optimizer start fresh")
    parser.add_argument("--start-over", action="store_true",
                        help="start a new run in a models root that holds one: the old run is moved "
                             "aside to <root>.<its run id> (never deleted)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the run's resolved config as JSON and exit (nothing is trained or written)")
    parser.add_argument("--print-layout", action="store_true",
                        help="print the CPU layout ./horovodrun.sh takes without -np (workers on this node, "
                             "sample_fc/run/layout.py) as JSON and exit")
    return parser


def say(line):
    """A note to the user before training starts, printed once (by the first rank) to stderr,
    so that stdout holds only what was asked for (--print-config's JSON)."""
    if launcher_rank() == 0:
        print(f"train.py: {line}", file=sys.stderr, flush=True)


def read_request(args):
    """The job's RunRequest: the command line (its --config file merged into `args`) and the
    restart supervisor's environment, read once; an automatic restart continues its run from
    the root's newest checkpoint of it."""
    experiment = read_experiment(args.config) if args.config else None
    if experiment:
        experiment.merged_into(args)
    request = RunRequest.read(args, experiment=experiment)
    if request.auto_resume:                          # restarted by restart.py
        typed = config.config_for_run(args.dataset, args.network, args.loss, args.overrides)
        request = request.restarted(request.models_root_for(typed))
    return request


def build_config(args, request):
    """The run's config (config.config_for_run); the demo data built on first use; the
    dataset's own class count and image size (its property file) unless --set names them."""
    resumed = resume.saved_config(request.resume, request.continued_run, note=say) if request.resume else None
    cfg = config.config_for_run(args.dataset, args.network, args.loss, args.overrides, resumed, note=say)
    if cfg.dataset == "demo" and cfg.rec == config.get_config("demo").rec:
        ensure_demo(os.path.dirname(cfg.rec),                # ranks and jobs wait on its lock; the
                    log=lambda line: print(f"train.py: {line}", file=sys.stderr, flush=True))  # builder says so
    if not request.resume:
        explicit = config.overridden_keys(args.overrides)
        if cfg.dataset == "demo" and cfg.rec != config.get_config("demo").rec and "lr" not in explicit:
            say(f"{cfg.rec} trains with the demo's recipe, tuned for its 200 synthetic identities (lr {cfg.lr:g} "
                f"per 512 images); on 5,000 real-image classes that lr sat at chance where 0.1 learned: "
                f"--dataset custom is the recipe for your own set (README, 'Training on real data')")
        builder.complete_from_data(cfg, args.overrides, say)
    return cfg


def chosen_layout(cfg, request):
    """run/layout.py's layout of this run on this node: a resumed run's world size is its
    checkpoint's; the networks' costs are symbols.cost's."""
    try:
        world = resume.saved_state(request.resume, request.continued_run)[1]["world_size"] if request.resume else None
    except UsageError as error:
        fail(f"{error} (see train.py --help)", USAGE_EXIT)

    def cost_of(network, image_size):
        return backbone_cost(get_symbol(network, cfg.embedding_size, image_size), image_size).multiply_adds
    return layout.for_run(cfg, os.cpu_count() or 1, cost_of, world)


def print_json(payload, indented):
    """`payload` as JSON on stdout; a reader that stops early (`| head`) ends it quietly."""
    try:
        print(json.dumps(payload, indent=2 if indented else None, sort_keys=indented), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
    return 0


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        request = read_request(args)     # the only reader of the restart supervisor's environment
        cfg = build_config(args, request)
    except UsageError as error:
        parser.error(str(error))
    if args.print_config or args.print_layout:
        return print_json(cfg if args.print_config else chosen_layout(cfg, request), args.print_config)
    # a signal from here on asks for a stop (run_events.RunEvents.stop); before training starts,
    # a second one, or the grace over, ends the process at once (nothing written yet)
    stop_signals = StopSignals(cfg.stop_signals, lambda number, reason: end_at_once(number, reason, launcher_rank()),
                               cfg.stop_grace_s).install()
    dist.init(stall_shutdown_s=cfg.collective_timeout_s,
              on_cpu=cfg.context == "cpu" or (cfg.context == "auto" and mx.context.num_gpus() == 0))
    status = RunStatus(request)          # rank 0 records in the run's status.json from start_run on
    watchdog = StepWatchdog(cfg.step_timeout_s, dist.rank(),
                            on_timeout=lambda line: fail(line, FAILURE_EXIT, status=status)).start()
    try:
        return train(cfg, request, status, watchdog, stop_signals)
    except (NonFiniteError, CheckpointError) as error:     # every rank raises it at the same step
        fail(str(error), FAILURE_EXIT, print_it=dist.rank() == 0, status=status)
    except UsageError as error:          # found by this rank (its data reader); horovodrun stops the others
        fail(f"{error} (rank {dist.rank()})", USAGE_EXIT, status=status)
    except mx.base.MXNetError as error:
        if dist.is_shutdown_error(error):
            lost_peer(error, cfg.collective_timeout_s, watchdog, status)
        status.failed(f"MXNetError: {mxnet_reason(error)}")
        raise
    except Exception as error:           # a bug or an unforeseen failure: its traceback follows
        status.failed(f"{type(error).__name__}: {error}")
        raise


def lost_peer(error, limit_s, watchdog, status):
    """End this rank in one line after a collective lost a peer (dist.is_shutdown_error: Gloo
    heard nothing from it for the limit, or Horovod shut the job down after that, its stall
    check, or another rank's failure). The line names this rank's step and
    stage, the rank it lost where that is known (the other of two; this one, when this process
    itself did not run for the limit: watchdog.paused_s), and the key that rides out longer
    pauses."""
    rank, world, paused = dist.rank(), dist.size(), watchdog.paused_s()
    raise_it = f"--set collective_timeout_s=N (now {limit_s}) rides out longer pauses"
    if paused >= 0.5 * limit_s:
        message = (f"rank {rank} did not run for {paused:.0f} s ({watchdog.where()}: stopped by a signal, swapped out "
                   f"or starved of CPU), and its peers stop waiting after collective_timeout_s={limit_s} s; {raise_it}")
        status.failed(message)
        fail(message, FAILURE_EXIT)
    time.sleep(SHUTDOWN_GRACE_S)         # the launcher should see the causing rank's exit first
    other = (f"rank {1 - rank}" if world == 2
             else "another rank (Horovod's 'Missing ranks' report names one that stalled)")
    message = (f"rank {rank} lost {other} in a collective ({watchdog.where()}): it failed, or sent nothing for "
               f"collective_timeout_s={limit_s} s (stopped, swapped out, starved of CPU, or its node lost); {raise_it}")
    status.failed(message, is_cause=False)     # the cause is another rank's (its own line)
    fail(message, FAILURE_EXIT)


def on_every_rank(work, name):
    """work() on every rank, then every rank learns whether any raised UsageError (dist.agree); if
    one did, all stop with the first such rank's line (exit 2). Returns work()'s result."""
    (result, problems, _), rank = dist.agree(work, name, UsageError), dist.rank()
    if any(problems):
        first = next(r for r, p in enumerate(problems) if p)
        dist.shutdown()                   # in step: MPI counts an exit without it as a failure
        fail(problems[first], USAGE_EXIT, print_it=rank == first)
    return result


def take_root(models_root, start_over, token):
    """Rank 0: the models root's lock; with --start-over, the run it holds moved aside.
    Returns (lock, where the old run went or None)."""
    lock = run_root.RootLock.acquire(models_root, token)
    moved = run_root.move_aside(models_root) if start_over and checkpoint.list_checkpoints(models_root) else None
    return lock, moved


def start_run(run, status):
    """Rank 0, the root taken: its log, config.json, the status (running) and, for a restart
    supervisor, where the run lives (RunStatus.start). From here a failure is recorded in the status."""
    builder.log_to_file(run.parts.logger, os.path.join(run.models_root, "train.log"))
    save_config(dict(run.cfg, run_id=run.run_id), os.path.join(run.models_root, "config.json"))
    status.start(run.models_root, run.run_id, step=run.resumed_at or 0, checkpoint=run.resume_from,
                 checkpoint_step=run.resumed_at, world_size=run.world, pid=os.getpid())
    run.parts.logger.info("world size %d; run %s in %s; config:\n%s", run.world, run.run_id, run.models_root,
                          format_config(run.cfg))


def train(cfg, request, status, watchdog, stop_signals=None):
    """The training job on this rank, Horovod initialised, as `request` (RunRequest) asks;
    rank 0 keeps the run's `status` (RunStatus); `watchdog` (StepWatchdog, started) is told of
    each stage, from the start's; `stop_signals` (StopSignals) ask for a stop.
    Returns the exit code: 0, or 128 + the signal's number after a stop."""
    rank, world = dist.rank(), dist.size()
    logger = builder.setup_logger(rank)
    mx.random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    auto = builder.resolve_auto(cfg, world)          # sample_ratio, bank_momentum=auto: the same on every rank
    models_root = request.models_root_for(cfg)
    # every rank checks the models root, config, data and checkpoint before anything is written
    watchdog.stage("at start, checking the run")
    run = on_every_rank(lambda: builder.open_run(cfg, models_root, request, dist.world(), logger), "setup.problems")
    lock, moved = on_every_rank(lambda: take_root(models_root, request.start_over, request.lock_token)
                                if rank == 0 else (None, None), "setup.root")      # rank 0 owns the root from here
    run = run.agreed(dist.allgather_object(run.run_id, "setup.run_id")[0])

    os.makedirs(models_root, exist_ok=True)
    if rank == 0:
        last_checkpoint_s = (run_root.read_status(models_root) or {}).get("checkpoint_seconds")
        start_run(run, status)
        if request.experiment:
            kept = run_root.keep_experiment(models_root, request.experiment, run.resumed_at)
            logger.info("--config %s: kept as %s", request.experiment.path, kept)
        if moved:
            logger.info("--start-over: the run that was in %s is now in %s", models_root, moved)
        run.log_opening(auto, builder.centers_line(cfg, world, auto))
    watchdog.stage("at start, building the model and the bank's initial centers")
    say = logger.info if rank == 0 else None
    module = builder.module_of(run, say=say)        # a resume's bank: the checkpoint's
    if run.resume_from:
        watchdog.stage("at start, reading the checkpoint")
        step = checkpoint.restore_checkpoint(run.resume_from, module, run.parts.train_iter, cfg.num_classes,
                                             cfg.embedding_size, say)
        logger.info("resumed from %s at step %d", run.resume_from, step)
    events = RunEvents(run, module, watchdog, status, stop_signals)
    module.connect(stage_hook=watchdog.stage, requests=events.requests)
    if rank == 0:
        events.announce_checkpoints(run.plan.checkpoint, last_checkpoint_s)
        events.event("start", run.resumed_at or 0, **run.facts(request.attempt))
    module.fit(run.parts.train_iter, cfg.max_update, events.callbacks)
    stop_signal = int(module.agreed.stop)                # every rank's, agreed in the last step
    if stop_signal:
        code = events.stop(module.num_update, stop_signal)
    else:
        events.end_of_run(module.num_update)
        code = 0
    watchdog.stop()
    if rank == 0:
        if not stop_signal:
            status.done(module.num_update)
        lock.release()
    logger.info("%s: %d steps, checkpoints in %s", "stopped" if stop_signal else "done", module.num_update,
                models_root)
    if rank == 0:
        logger.info("report: python -m sample_fc.tools.report %s", models_root)
    mx.nd.waitall()              # an orderly exit: no pending MXNet ops, decoders, or Horovod
    if hasattr(run.parts.train_iter, "close"):
        run.parts.train_iter.close()
    dist.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
