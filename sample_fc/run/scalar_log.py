"""Where a run's scalars go besides its log and progress.jsonl, on rank 0: TensorBoard
(`tensorboard=true`, the default: tensorboardX event files in <models root>/tensorboard) and
Weights & Biases (`wandb=offline` or `online`: one W&B run per job, grouped by the run id, so a
resumed run's jobs are one group; its files in <models root>/wandb; `wandb_project` names the
project). Both get the same scalars at the same steps: loss, lr, samples_per_s, grad_norm,
clipped_share, verification/<target>, verification_tar_at_far/<target>.

A missing tensorboardX is one warning and the run goes on; W&B asked for without its package
is refused before anything is written (`check_available`, a UsageError naming the install), and
a W&B run that cannot start (not logged in, no network for `online`) is one warning.
"""
import contextlib
import importlib.util
import os
import signal

from ..errors import UsageError
from ..options import signal_number

WANDB_INSTALL = "pip install wandb==0.16.6"     # the version the tests run (requirements-test.txt)


def check_available(cfg):
    """UsageError when cfg asks for W&B and the wandb package is not installed."""
    if cfg.wandb != "off" and importlib.util.find_spec("wandb") is None:
        raise UsageError(f"wandb={cfg.wandb} needs the wandb package, which is not installed: "
                         f"{WANDB_INSTALL} (or --set wandb=off)")


def tensorboard_writer(cfg, rank, models_root, logger=None):
    """A tensorboardX SummaryWriter on rank 0 when cfg.tensorboard, else None (and one line in
    the log when tensorboardX cannot be imported: the run goes on without it)."""
    if not (cfg.tensorboard and rank == 0):
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError as error:
        if logger is not None:
            logger.warning("tensorboard: tensorboardX cannot be imported (%s); no TensorBoard events "
                           "(pip install tensorboardX==2.6.2.2, or --set tensorboard=false)", error)
        return None
    return SummaryWriter(os.path.join(models_root, "tensorboard"))


class WandbRun:
    """A W&B run taking add_scalar(name, value, step) as a SummaryWriter does. W&B writes through
    a service process of its own; when that is gone (a stop's SIGTERM to the job's process group
    reaches it too) the run loses W&B with one warning and goes on to its checkpoint."""

    def __init__(self, run, logger=None):
        self.run, self.logger = run, logger

    def add_scalar(self, name, value, step):
        if self.run is not None:
            self._guarded(self.run.log, {name: value}, step=step)

    def close(self):
        if self.run is not None:
            self._guarded(self.run.finish, quiet=True)
            self.run = None

    def _guarded(self, call, *args, **kwargs):
        try:
            call(*args, **kwargs)
        except Exception as error:      # W&B's own error types, a broken pipe to its service
            self.run = None
            if self.logger is not None:
                self.logger.warning("wandb: W&B stopped taking this run's scalars (%s: %s); the run goes on "
                                    "without it, what was logged before stays in the W&B run",
                                    type(error).__name__, error)


@contextlib.contextmanager
def stop_signals_blocked(names):
    """The run's stop signals (and SIGINT, SIGTERM) blocked in this thread meanwhile: a process
    started meanwhile inherits the mask, so a stop sent to the whole job (horovodrun passes
    SIGTERM to every process a worker started) leaves it running while this rank stops. W&B's
    service is one: stopped with the ranks, it took the scalars of the stop with it and W&B
    ended the rank with exit code 255 at its finish. A signal that arrives meanwhile is
    delivered here afterwards, not lost."""
    blocked = {signal.SIGINT, signal.SIGTERM} | {signal_number(name) for name in names}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def wandb_run(cfg, rank, models_root, run_id, logger=None):
    """Rank 0's WandbRun when cfg.wandb is offline or online, else None; one warning line (and
    None) when W&B cannot start the run."""
    if cfg.wandb == "off" or rank != 0:
        return None
    os.environ.setdefault("WANDB_SILENT", "true")          # no banner on the training log
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # no crash-report traffic of W&B's own (Sentry)
    import wandb
    directory = os.path.abspath(models_root)
    os.makedirs(directory, exist_ok=True)
    try:
        with stop_signals_blocked(cfg.stop_signals):   # W&B's service process is started here
            run = wandb.init(project=cfg.wandb_project, dir=directory, mode=cfg.wandb, group=run_id,
                             name=os.path.basename(directory), config=dict(cfg), job_type="train", reinit=True,
                             settings=wandb.Settings(silent=True, console="off", _disable_stats=True))
    except Exception as error:          # W&B's errors (login, network) are its own types
        if logger is not None:
            logger.warning("wandb: the W&B run did not start (%s); the run goes on without it "
                           "(wandb login, or --set wandb=offline)", str(error).splitlines()[0] if str(error) else
                           type(error).__name__)
        return None
    return WandbRun(run, logger)


class ScalarLog:
    """The run's scalar sinks as one: add_scalar goes to each, close closes each."""

    def __init__(self, sinks):
        self.sinks = [sink for sink in sinks if sink is not None]

    def add_scalar(self, name, value, step):
        for sink in self.sinks:
            sink.add_scalar(name, value, step)

    def close(self):
        for sink in self.sinks:
            sink.close()


def open_scalar_log(cfg, rank, models_root, run_id, logger=None):
    """Rank 0's ScalarLog (TensorBoard and W&B as cfg asks), or None when it has no sink."""
    log = ScalarLog([tensorboard_writer(cfg, rank, models_root, logger),
                     wandb_run(cfg, rank, models_root, run_id, logger)])
    return log if log.sinks else None
