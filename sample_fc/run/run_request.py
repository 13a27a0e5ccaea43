"""What a training job was asked to do, read once, and rank 0's record of how it went.

RunRequest holds the command line's run options (--models-root, --resume, --pretrained,
--start-over) and what a restart supervisor (restart.py) tells the job through the
environment (run_root's *_ENV names). train.py reads it once in main() and passes it down;
nothing else reads those variables. It decides which models root the job trains into, which
run it continues and the run's id (RunRequest.run_id: the one place that decides it).

RunStatus is rank 0's hold on the run's status.json once the run has started: it marks the
run running (tagged with the supervisor's attempt, so the supervisor never takes an earlier
attempt's status for this one's), records a failure's line, or the end. restart.py learns
why an attempt failed from these fields alone, never from the job's output.
"""
import dataclasses
import os
from typing import Optional

from . import run_root
from ..config import write_json
from ..errors import UsageError


@dataclasses.dataclass(frozen=True)
class RunRequest:
    models_root: Optional[str] = None   # --models-root; None: the resumed run's own, else models/<dataset>_<network>
    resume: Optional[str] = None        # --resume: a checkpoint or a models root (a restart: its root, see restarted)
    pretrained: Optional[str] = None    # --pretrained PREFIX[,EPOCH]: a new run from trained weights
    start_over: bool = False            # --start-over: move the root's run aside and start a new one
    auto_resume: bool = False           # AUTO_RESUME_ENV=1: an automatic restart of the supervisor's run
    supervisor_run_id: Optional[str] = None     # RUN_ID_ENV: the run the supervisor continues
    lock_token: str = ""                # LOCK_TOKEN_ENV: the token of the root's lock the supervisor holds for us
    run_file: Optional[str] = None      # RUN_FILE_ENV: where rank 0 tells the supervisor its root and run id
    attempt: Optional[str] = None       # ATTEMPT_ENV: the supervisor's id of this attempt (into status.json)
    experiment: Optional[object] = None  # --config: experiment_file.ExperimentFile (kept in the root at start)

    @classmethod
    def read(cls, args, environ=None, experiment=None):
        """The request of train.py's parsed command line `args` (with its --config file's
        `experiment` merged in) and the supervisor's environment (`environ`, default os.environ).
        UsageError for --start-over with --resume."""
        environ = os.environ if environ is None else environ
        if args.start_over and args.resume:
            raise UsageError("--start-over begins a new run; --resume continues one: give one of them")
        return cls(models_root=args.models_root, resume=args.resume, pretrained=args.pretrained,
                   start_over=args.start_over, auto_resume=environ.get(run_root.AUTO_RESUME_ENV) == "1",
                   supervisor_run_id=environ.get(run_root.RUN_ID_ENV) or None,
                   lock_token=environ.get(run_root.LOCK_TOKEN_ENV, ""),
                   run_file=environ.get(run_root.RUN_FILE_ENV) or None,
                   attempt=environ.get(run_root.ATTEMPT_ENV) or None, experiment=experiment)

    def models_root_for(self, cfg):
        """--models-root; else, resuming, that run's own root; else models/<dataset>_<network>."""
        from ..checkpoint import models_root_of  # (mxnet: only when needed)
        if self.models_root:
            return self.models_root
        if self.resume:
            return models_root_of(self.resume)
        return default_models_root(cfg)

    def restarted(self, models_root):
        """The request an automatic restart carries out in `models_root`: when the root holds
        complete checkpoints of the continued run, continue it from the newest (--resume becomes
        the root, even when the command named a checkpoint) and do not begin it again
        (--pretrained, --start-over dropped); else the command as typed (a run that failed
        before its first checkpoint starts afresh, under the supervisor's run id)."""
        if not self.auto_resume:
            return self
        continuing = dataclasses.replace(self, resume=models_root, pretrained=None, start_over=False)
        return continuing if run_root.checkpoints_of_run(models_root, continuing.continued_run) else self

    @property
    def continued_run(self):
        """The id of the run this job continues, whose checkpoints alone a resume takes: the
        supervisor's, else that of the models root --resume names; None for a fresh start or a
        checkpoint named directly (that checkpoint is taken, and its state names its run)."""
        from ..checkpoint import is_complete
        if self.supervisor_run_id:
            return self.supervisor_run_id
        if self.resume is None or is_complete(self.resume):
            return None
        return run_root.run_id_of(self.resume)

    def run_id(self, resumed_state=None):
        """The run's id, decided here only, first found of: the resumed checkpoint's
        (`resumed_state`, its state.json), the run the supervisor or --resume continues
        (continued_run), a new one (run_root.new_run_id: every rank makes one; rank 0's is taken)."""
        return (resumed_state or {}).get("run_id") or self.continued_run or run_root.new_run_id()


class RunStatus:
    """Rank 0's record of this job in the run's status.json (run_root.write_status), from
    `start` on; owned by train.py's main(). Before `start` (nothing written to the root yet),
    after `done` and on the other ranks it records nothing."""

    def __init__(self, request):
        self.request, self.models_root = request, None

    def start(self, models_root, run_id, **fields):
        """The run is running in `models_root` (status `fields` besides): say so in its status,
        with this attempt's id, and tell the supervisor where the run lives (its run file)."""
        run_root.write_status(models_root, run_id=run_id, state="running", error=None, error_is_cause=None,
                              attempt=self.request.attempt, **fields)
        self.models_root = models_root
        if self.request.run_file:
            write_json(self.request.run_file, {"models_root": os.path.abspath(models_root), "run_id": run_id})

    def failed(self, message, is_cause=True):
        """Record the failure once (the first recorded stays): state failed, error `message`.
        `is_cause` False: this rank only saw the job shut down around it (another rank failed),
        so the same line again says nothing about the failure repeating."""
        if self.models_root:
            run_root.write_status(self.models_root, state="failed", error=message, error_is_cause=is_cause)
            self.models_root = None

    def stopped(self, step, signal_name, checkpoint=None, note=None):
        """The run was stopped on purpose (`signal_name`) after `step`; `checkpoint`: the complete
        checkpoint of that step (None when the stop was cut short: `note` says why)."""
        if self.models_root:
            run_root.write_status(self.models_root, state="stopped", step=step, signal=signal_name,
                                  error=note, **({"checkpoint": checkpoint, "checkpoint_step": step}
                                                 if checkpoint else {}))
            self.models_root = None

    def done(self, step):
        """The run finished at `step`."""
        run_root.write_status(self.models_root, state="done", step=step)
        self.models_root = None


def default_models_root(cfg):
    """models/<dataset>_<network>: where a run goes without --models-root (train.py, tools.plan)."""
    return os.path.join("models", f"{cfg.dataset}_{cfg.network}")
