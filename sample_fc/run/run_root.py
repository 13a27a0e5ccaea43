"""A models root owned by one run: its lock, its run id and its status file.

    <parent>/.<name>.lock    an flock held by rank 0 of the job training into <parent>/<name>
                             (or by the restart supervisor between attempts); it dies with its
                             process. Its text names the holder: host, pid, start time, token.
    <root>/status.json       written atomically by rank 0: the run id, state (running | failed |
                             stopped | done), the last step reached, the last complete checkpoint
                             and its step, the last verification, the signal that stopped it
                             (stopped: on purpose, not restarted), the error line when it failed (and
                             error_is_cause: false when rank 0 only saw another rank's failure
                             shut the job down), the restart supervisor's attempt id.
    <root>/experiment.cfg    a copy of the --config file the run started from (experiment_file.py);
                             a resume given --config keeps its own as experiment.step-<N>.cfg
    <root>/progress.jsonl    one JSON line per progress line of the log (rank 0): step, loss, lr,
                             samples/s, gradient norm. restart.py, bench and the tests read these
                             two files; nothing parses log lines for progress.

The lock file sits beside the root, not in it, so a root can be moved aside under the lock and
a second job changes nothing in a root it is refused. A run id names one run from its fresh
start through every resume; it is written to config.json, status.json and every checkpoint's
state.json, and resuming takes only checkpoints of the run being continued.
"""
import datetime
import fcntl
import json
import os
import re
import socket
import uuid

from ..config import write_json, write_text
from ..errors import UsageError

STATUS_FILE = "status.json"
PROGRESS_FILE = "progress.jsonl"
EVENTS_FILE = "events.jsonl"          # one JSON line per event of the run (rank 0: callbacks.append_event)
EXPERIMENT_FILE = "experiment.cfg"    # the --config file a new run started from (a resume's: experiment.step-N.cfg)
VERIFICATION_DIR = "verification"     # <target>.npz: the latest verification's pairs (callbacks)
STATES = ("running", "failed", "stopped", "done")
# What a restart supervisor (restart.py) tells the job it starts, through the environment:
AUTO_RESUME_ENV = "SAMPLE_FC_AUTO_RESUME"   # "1": continue the root's run from its newest checkpoint
RUN_ID_ENV = "SAMPLE_FC_RUN_ID"             # the run being continued (a fresh attempt takes this id)
LOCK_TOKEN_ENV = "SAMPLE_FC_LOCK_TOKEN"     # the token of the lock the supervisor holds for the job
RUN_FILE_ENV = "SAMPLE_FC_RUN_FILE"         # where rank 0 writes {"models_root", "run_id"} at start
ATTEMPT_ENV = "SAMPLE_FC_ATTEMPT"           # this attempt's id, which rank 0 writes into status.json
# (train.py reads them once, into run_request.RunRequest)


def lock_path(models_root):
    parent, name = os.path.split(os.path.abspath(models_root))
    return os.path.join(parent, f".{name}.lock")


def status_path(models_root):
    return os.path.join(models_root, STATUS_FILE)


def progress_path(models_root):
    return os.path.join(models_root, PROGRESS_FILE)


def new_run_id():
    """A fresh run's id: its start time and 6 random hex digits (20261124-140712-3fa9c1)."""
    return f"{datetime.datetime.now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def _holder(handle):
    handle.seek(0)
    try:
        return json.loads(handle.read() or "{}")
    except ValueError:
        return {}


def _in_use(models_root, holder):
    started = holder.get("started", "?")
    when = started[11:16] if len(started) >= 16 else started
    return UsageError(f"{models_root} is in use by a run started {when} on host {holder.get('host', '?')} "
                      f"(pid {holder.get('pid', '?')}); wait for it, or use --models-root")


def _lock_or_refuse(handle, models_root, token):
    """Try the flock on the open lock file `handle`: True when taken; False when its holder holds
    it for `token`'s job (a restart supervisor); UsageError naming any other holder."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        holder = _holder(handle)
        if token and holder.get("token") == token:
            return False
        raise _in_use(models_root, holder) from None


class RootLock:
    """The lock of a models root, held while this object is open."""

    def __init__(self, models_root, handle, held_for_us):
        self.models_root, self.handle, self.held_for_us = models_root, handle, held_for_us

    @classmethod
    def acquire(cls, models_root, token=""):
        """Take the root's lock (creating the lock file beside the root). When another process
        holds it: the same lock when that holder wrote our `token` (a restart supervisor holding
        it for this job), else UsageError naming the holder."""
        path = lock_path(models_root)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a+")
        try:
            taken = _lock_or_refuse(handle, models_root, token)
        except UsageError:
            handle.close()
            raise
        if not taken:
            handle.close()
            return cls(models_root, None, held_for_us=True)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": token,
                                 "started": datetime.datetime.now().isoformat(timespec="seconds")}))
        handle.flush()
        return cls(models_root, handle, held_for_us=False)

    def release(self):
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()
            self.handle = None


def check_not_in_use(models_root, token=""):
    """UsageError naming the holder when another job holds the root's lock; creates nothing."""
    path = lock_path(models_root)
    if not os.path.isfile(path):
        return
    with open(path) as handle:
        if _lock_or_refuse(handle, models_root, token):
            fcntl.flock(handle, fcntl.LOCK_UN)


# ---- status ----------------------------------------------------------------------------------
def read_status(models_root):
    """The root's status (a dict), or None when it has none or it cannot be read."""
    try:
        with open(status_path(models_root)) as handle:
            status = json.load(handle)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def write_status(models_root, **fields):
    """Update the root's status with `fields` (atomically; the time of the update added)."""
    if "state" in fields and fields["state"] not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {fields['state']!r}")
    status = dict(read_status(models_root) or {}, **fields)
    status["updated"] = datetime.datetime.now().isoformat(timespec="seconds")
    write_json(status_path(models_root), status)
    return status


def append_record(path, record):
    """Append one record (a JSON-able dict) as a line of the jsonl file `path`."""
    with open(path, "a") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def append_progress(models_root, record):
    """Append one progress record as a line of progress.jsonl."""
    append_record(progress_path(models_root), record)


def read_records(path):
    """The records of the jsonl file `path`, oldest first ([] without it); a line cut short by a
    killed writer is skipped."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_progress(models_root):
    """The root's progress records, oldest first ([] without any)."""
    return read_records(progress_path(models_root))


def read_events(models_root):
    """The root's events.jsonl records, oldest first ([] without any)."""
    return read_records(os.path.join(models_root, EVENTS_FILE))


def run_id_of(models_root):
    """The id of the run a root holds: its status, else its newest checkpoint's; None for a
    root without either (empty, or saved before run ids)."""
    from ..checkpoint import list_checkpoints, read_state  # (mxnet: only when needed)
    status = read_status(models_root)
    if status and status.get("run_id"):
        return status["run_id"]
    found = list_checkpoints(models_root)
    if found:
        try:
            return read_state(found[-1][1], needs=()).get("run_id")
        except ValueError:
            return None
    return None


def checkpoints_of_run(models_root, run_id):
    """[(step, path)] of the root's complete checkpoints that belong to run `run_id` (all of
    them when run_id is None: a root saved before run ids), oldest first. One whose state.json
    does not read is kept: the resume checks it, names it damaged and goes back past it."""
    from ..checkpoint import list_checkpoints, read_state
    if run_id is None:
        return list_checkpoints(models_root)
    mine = []
    for step, path in list_checkpoints(models_root):
        try:
            if read_state(path, needs=()).get("run_id") == run_id:
                mine.append((step, path))
        except ValueError:               # unreadable: not known to be another run's
            mine.append((step, path))
    return mine


def check_fresh_start(models_root):
    """UsageError when a fresh start into `models_root` would overwrite a run's checkpoints."""
    from ..checkpoint import list_checkpoints
    found = list_checkpoints(models_root)
    if found:
        run = run_id_of(models_root) or "(saved before run ids)"
        raise UsageError(f"{models_root} holds run {run} at step {found[-1][0]}: continue it with "
                         f"--resume {models_root}, start over with --start-over (the old run is moved "
                         f"aside, not deleted), or choose another --models-root")


def move_aside(models_root):
    """Rename `models_root` to a free sibling named after its run id; returns the new path."""
    base = f"{os.path.abspath(models_root).rstrip(os.sep)}.{run_id_of(models_root) or 'old'}"
    target, n = base, 1
    while os.path.exists(target):
        n += 1
        target = f"{base}-{n}"
    os.rename(models_root, target)
    return target


def experiment_copy_path(models_root, resumed_at=None):
    """Where a run keeps its --config file: EXPERIMENT_FILE for a new run, experiment.step-<N>.cfg
    for one resumed at step N (the first run's copy stays)."""
    name = EXPERIMENT_FILE if resumed_at is None else f"experiment.step-{resumed_at}.cfg"
    return os.path.join(models_root, name)


def keep_experiment(models_root, experiment, resumed_at=None):
    """Rank 0: a copy of the run's --config file (experiment_file.ExperimentFile) in its root,
    with the path it came from on its first line; returns the copy's path."""
    path = experiment_copy_path(models_root, resumed_at)
    write_text(path, f"# from --config {os.path.abspath(experiment.path)}\n{experiment.text}")
    return path


def experiment_copies(models_root):
    """[(file name, path)] of the --config copies a root holds: the first run's, then each
    resume's by step."""
    found = []
    for name in os.listdir(models_root) if os.path.isdir(models_root) else ():
        matched = re.fullmatch(r"experiment(?:\.step-(\d+))?\.cfg", name)
        if matched:
            found.append((-1 if matched.group(1) is None else int(matched.group(1)), name))
    return [(name, os.path.join(models_root, name)) for _, name in sorted(found)]
