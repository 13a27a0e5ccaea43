"""Restart a failed training job from its run's newest complete checkpoint.

    python -m sample_fc.launch --max-restarts N [--min-workers M] -np ... -H ... python train.py ...

Runs horovodrun; when the job exits non-zero it is started again, up to N times. The job
tells the supervisor where its run lives through a small file (run_root.RUN_FILE_ENV: rank 0
writes the models root and the run id there at start); the run's status.json then says the
step reached and the last complete checkpoint. Between attempts the supervisor holds the
models root's lock, and each attempt gets its token (LOCK_TOKEN_ENV), so no other job can
take the root; a restart continues that run only (RUN_ID_ENV, AUTO_RESUME_ENV: train.py
resumes from the run's newest complete checkpoint, or starts it afresh when it has none).
Each attempt has its id (ATTEMPT_ENV), which rank 0 writes into the status: the supervisor
reads the cause of a failure from the status of that attempt only (failure_cause: the error
rank 0 recorded there, or none) and the exit code; it never reads the job's output, which it
passes through untouched. Each restart is logged with its cause and the step it resumes from.
It re-reads the hosts (-H or --hostfile) and keeps those still reachable (ssh); fewer workers
resume with the bank resharded; fewer than --min-workers stops. Not retried: a run stopped on
purpose (a SIGINT or SIGTERM the supervisor passed on once to the job, which runs in a session
of its own, or a status "stopped"), a mistake (exit code errors.USAGE_EXIT), or the same error
recorded twice in a row from the same checkpoint (an attempt without a recorded error, or with only
rank 0's view of another rank's failure, says nothing deterministic and is retried).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

from . import run_root
from ..errors import USAGE_EXIT, UsageError
from .stop import signal_name

LOCK_WAIT_S = 30        # a failed job's processes may take this long to let go of the root's lock
LOCAL_HOSTS = {"localhost", "127.0.0.1", socket.gethostname()}


def log(message):
    print(f"[restart] {message}", file=sys.stderr, flush=True)


def option_value(args, *names):
    """The value after the first of `names` in args (or in name=value form), else None."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def replace_option(args, names, value):
    """args with the value of option `names` (spelled like its first use) set to value."""
    out, i = [], 0
    while i < len(args):
        if args[i] in names:
            out += [args[i], value]
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def parse_hosts(text):
    """'h1:4,h2:2' -> [('h1', 4), ('h2', 2)] (a host without slots has 1)."""
    hosts = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, slots = part.partition(":")
        hosts.append((name, int(slots) if slots else 1))
    return hosts


def read_hostfile(path):
    """A hostfile's hosts: lines 'host slots=N' or 'host:N' ('#' comments)."""
    hosts = []
    with open(path) as handle:
        for line in handle:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            match = re.match(r"(\S+)\s+slots\s*=\s*(\d+)", line)
            hosts += [(match.group(1), int(match.group(2)))] if match else parse_hosts(line)
    return hosts


def ssh_reachable(host, args, timeout_s=10):
    if host in LOCAL_HOSTS:
        return True
    command = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout_s}", "-o", "StrictHostKeyChecking=no"]
    port, identity = option_value(args, "--ssh-port", "-p"), option_value(args, "--ssh-identity-file", "-i")
    command += (["-p", port] if port else []) + (["-i", identity] if identity else []) + [host, "true"]
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout_s + 5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def current_hosts(args, reachable=ssh_reachable):
    """(hosts still reachable, total hosts) from -H/--hosts or --hostfile, re-read now; None
    when the command names no hosts (horovodrun's default: this machine)."""
    text, hostfile = option_value(args, "-H", "--hosts"), option_value(args, "-hostfile", "--hostfile")
    hosts = read_hostfile(hostfile) if hostfile else parse_hosts(text) if text else None
    if hosts is None:
        return None
    return [(name, slots) for name, slots in hosts if reachable(name, args)], hosts


class Signals:
    """The supervisor's stop: SIGINT and SIGTERM reaching it are passed on, each once, to the
    attempt running (in a session of its own, so a terminal's Ctrl-C reaches it only this way:
    once, not twice), and no attempt follows a signal."""

    def __init__(self):
        self.received, self.child = 0, None
        self.previous = {number: signal.signal(number, self._forward) for number in (signal.SIGINT, signal.SIGTERM)}

    def restore(self):
        """The handlers the process had before."""
        for number, handler in self.previous.items():
            signal.signal(number, handler)

    def _forward(self, number, frame):
        self.received = self.received or number
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(number)


def run_attempt(command, env, signals):
    """Run command, its output going straight to ours; returns its exit code."""
    sys.stdout.flush()
    with subprocess.Popen(command, env=env, start_new_session=True) as child:
        signals.child = child
        if signals.received:             # a signal came before the child existed
            child.send_signal(signals.received)
        return child.wait()


def failure_cause(code, status):
    """(what ended an attempt that exited with `code`, whether seeing it again from the same
    checkpoint means it repeats), from `status`: that attempt's status.json, None when the
    attempt wrote none (it ended before its run started, or rank 0 runs on another host). The
    error rank 0 recorded (state failed) is the cause; it repeats unless rank 0 only saw
    another rank's failure shut the job down (error_is_cause false). Without one, a rank was
    killed or hung, or failed on another rank than 0 (its own output says how)."""
    if status and status.get("state") == "failed" and status.get("error"):
        return f"exit code {code}, {status['error']}", status.get("error_is_cause") is not False
    if status is None:
        return f"exit code {code} (no status from this attempt: it ended before its run started)", False
    return f"exit code {code} (no error recorded: a rank was killed or hung, or failed on a rank other than 0)", False


def read_run(run_file, attempt):
    """(models root, run id, the root's status, the status if attempt `attempt` wrote it) the
    job reported, each None when it did not say."""
    try:
        with open(run_file) as handle:
            run = json.load(handle)
    except (OSError, ValueError):
        return None, None, None, None
    root = run.get("models_root")
    status = run_root.read_status(root) if root else None
    return root, run.get("run_id"), status, status if status and status.get("attempt") == attempt else None


def hold_root(root, token):
    """The root's lock, taken for the next attempt (a failed job's processes may still be
    exiting: retried for LOCK_WAIT_S); None when another job holds it."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return run_root.RootLock.acquire(root, token)
        except UsageError as error:
            if time.monotonic() > deadline:
                log(f"not restarted: {error}")
                return None
            time.sleep(1)


def supervise(horovodrun_argv, max_restarts, min_workers=1):
    """Run `horovodrun_argv` (a full command line) until it succeeds, restarting it from its
    run's newest checkpoint up to max_restarts times. Returns the exit code to end with."""
    token = uuid.uuid4().hex
    with tempfile.TemporaryDirectory(prefix="sample_fc-restart-") as folder:
        run_file = os.path.join(folder, "run.json")
        env = dict(os.environ, **{run_root.LOCK_TOKEN_ENV: token, run_root.RUN_FILE_ENV: run_file})
        for variable in (run_root.AUTO_RESUME_ENV, run_root.RUN_ID_ENV):
            env.pop(variable, None)                    # the first attempt is the command as typed
        args, previous, restarts, redone, lost_s, lock = list(horovodrun_argv), None, 0, 0, 0.0, None
        signals = Signals()
        try:
            while True:
                start, attempt = time.monotonic(), f"{restarts + 1}-{uuid.uuid4().hex[:8]}"
                env[run_root.ATTEMPT_ENV] = attempt
                code = run_attempt(args, env, signals)
                if code == 0:
                    if restarts:
                        log(f"done after {restarts} restart(s): {redone} steps redone, "
                            f"{lost_s:.0f} s spent in failed attempts")
                    return 0
                lost_s += time.monotonic() - start
                root, run_id, status, attempt_status = read_run(run_file, attempt)
                step = (status or {}).get("checkpoint_step")     # where the run stands, whichever attempt said it
                cause, repeats = failure_cause(code, attempt_status)
                if signals.received or (attempt_status or {}).get("state") == "stopped":
                    stopped_by = signal_name(signals.received) if signals.received else attempt_status["signal"]
                    log(f"not restarted: the run was stopped on purpose ({stopped_by}, exit code {code})"
                        + (f"; its checkpoint is step {step} in {root}" if step is not None else ""))
                    return code
                if code == USAGE_EXIT:
                    log(f"not restarted: exit code {code} is a mistake in the command, config or data (the "
                        f"job's error line above names it); fix it and run again")
                    return code
                if repeats and previous == (cause, step):
                    log(f"not restarted: the same error twice in a row from the same checkpoint ({cause})")
                    return code
                if restarts >= max_restarts:
                    log(f"giving up after {restarts} restart(s): {cause}")
                    return code
                hosts = current_hosts(args)
                if hosts is not None:
                    alive, listed = hosts
                    workers = min(int(option_value(args, "-np", "--num-proc") or 0), sum(s for _, s in alive))
                    if workers < min_workers:
                        log(f"not restarted: {workers} worker slot(s) reachable on {len(alive)} of {len(listed)} "
                            f"host(s), fewer than --min-workers {min_workers}")
                        return code
                    if option_value(args, "-H", "--hosts"):
                        args = replace_option(args, ("-H", "--hosts"), ",".join(f"{n}:{s}" for n, s in alive))
                    args = replace_option(args, ("-np", "--num-proc"), str(workers))
                if root and lock is None:          # hold the root from now on, for this run only
                    lock = hold_root(root, token)
                    if lock is None:
                        return code
                if run_id:
                    env[run_root.RUN_ID_ENV] = run_id
                env[run_root.AUTO_RESUME_ENV] = "1"
                redone += max(0, (attempt_status or {}).get("step", 0) - (step or 0))
                previous, restarts = (cause, step) if repeats else None, restarts + 1
                log(f"restart {restarts}/{max_restarts} after {cause}; resuming from "
                    f"{f'step {step} in {root}' if step is not None else 'the start (no checkpoint yet)'}")
        finally:
            signals.restore()
            if lock is not None:
                lock.release()
