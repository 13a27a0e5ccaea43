"""Bounded processes and local Horovod jobs: the harness of the tests and the benchmarks.

`run_job` runs `horovodrun -np N -H localhost:N` from Python; a job that does not finish in
time is killed as a whole (its process group), so a hang becomes a failure instead of a wait.
"""
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

CONTROLLERS = ("gloo", "mpi")


@dataclass
class JobResult:
    returncode: int      # horovodrun's exit code; -9 when killed for the time bound
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    @property
    def output(self):
        return self.stdout + self.stderr


def horovodrun_command(argv, num_proc=2, controller="gloo", hosts=None):
    """The horovodrun command line that runs `argv` (a list) on `num_proc` local workers."""
    if controller not in CONTROLLERS:
        raise ValueError(f"controller must be one of {CONTROLLERS}, got {controller!r}")
    hosts = hosts or f"localhost:{num_proc}"
    return [sys.executable, "-m", "sample_fc.launch", "-np", str(num_proc), "-H", hosts, f"--{controller}"] + list(argv)


def single_thread_env(extra=None):
    """Environment for workers sharing a small machine: one compute thread per worker."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "1",
                "OPENBLAS_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def run_bounded(command, timeout_s=300, env=None, cwd=None):
    """Run a command in its own process group; kill the whole group after `timeout_s`."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env if env is not None else single_thread_env(), cwd=cwd,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        timed_out = True
    return JobResult(proc.returncode, stdout, stderr, timed_out, time.monotonic() - start)


def run_job(argv, num_proc=2, controller="gloo", timeout_s=300, env=None, cwd=None):
    """Run `argv` on `num_proc` local workers, under horovodrun when there are several (a
    world of one runs the command alone); kill everything after `timeout_s`."""
    command = horovodrun_command(argv, num_proc, controller) if num_proc > 1 else list(argv)
    return run_bounded(command, timeout_s, env, cwd)
