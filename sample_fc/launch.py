"""Start a local multi-process Horovod job with a hard time bound.

Used by the tests and the benchmarks to run `horovodrun -np N -H localhost:N` from Python:
a job that does not finish in time is killed as a whole (its process group), so a hang
becomes a failure instead of a wait.
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


def horovodrun_main():
    """`python -m sample_fc.launch [--max-restarts N [--min-workers M]] ARGS` = `horovodrun ARGS`
    under this interpreter; with --max-restarts, a failed job is restarted from its newest
    checkpoint (sample_fc.restart).

    The bootstrap builds horovodrun with scripts/patch_horovod.py's fixes: it passes the
    training command's options through untouched (no abbreviation matching, so
    `train.py --network r100` works) and a worker's error exit ends it with that worker's
    exit code and one line, not a traceback.
    """
    args, restart_options = sys.argv[1:], {"--max-restarts": None, "--min-workers": "1"}
    while args and args[0] in restart_options:
        if len(args) < 2 or not args[1].isdigit():
            sys.exit(f"sample_fc.launch: {args[0]} needs a whole number, got {args[1:2]}")
        restart_options[args[0]] = args[1]
        args = args[2:]
    if restart_options["--max-restarts"] is not None:
        from .restart import supervise
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        return supervise([horovodrun] + args, int(restart_options["--max-restarts"]),
                         int(restart_options["--min-workers"]))
    from horovod.runner.launch import run_commandline
    sys.argv[0:] = ["horovodrun"] + args
    return run_commandline()


def launcher_rank():
    """This process's rank as its launcher set it (horovodrun under Gloo or MPI, mpirun,
    srun), readable before Horovod starts; 0 when there is no launcher."""
    for variable in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return 0


def horovodrun_command(argv, num_proc=2, controller="gloo", hosts=None):
    """The horovodrun command line that runs `argv` (a list) on `num_proc` local workers."""
    if controller not in CONTROLLERS:
        raise ValueError(f"controller must be one of {CONTROLLERS}, got {controller!r}")
    hosts = hosts or f"localhost:{num_proc}"
    return [sys.executable, "-m", "sample_fc.launch", "-np", str(num_proc), "-H", hosts, f"--{controller}"] + list(argv)


def omp_threads():
    """OMP_NUM_THREADS as a positive int, or None when it is unset or not one."""
    configured = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(configured) if configured.isdigit() and int(configured) >= 1 else None


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


if __name__ == "__main__":
    sys.exit(horovodrun_main())
