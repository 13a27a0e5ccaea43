"""Test that a job stopped by a signal (a scheduler's SIGTERM, a terminal's SIGINT) stops every
rank after the same step with a checkpoint of it, exits 128 + the signal, and resumes exactly;
that a second signal ends it at once; that checkpoints come by the clock; and that the restart
supervisor does not restart a stopped run."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil

from conftest import REPO, TINY_TRAIN, WORKERS, per_rank_tail, run_train
from sample_fc.checkpoint import list_checkpoints
from bench.harness import horovodrun_command, single_thread_env
from sample_fc.run.stop import SAME_STOP_S
from test_train import checkpoint_arrays

LONG = ["--set", "max_update=100000", "--set", "ckpt_period=100000"]     # runs until it is stopped
GRACE_S = 25


def start(root, rec, *extra, supervised=False, fault=()):
    """train.py (with a `fault`: faulty_train.py's KIND STEP RANK) under horovodrun (or the restart
    supervisor) in a session of its own, running."""
    entry = [str(WORKERS / "faulty_train.py"), *map(str, fault), "--"] if fault else [str(REPO / "train.py")]
    argv = [sys.executable, *entry, "--models-root", str(root), "--set", f"rec={rec}", *TINY_TRAIN, *map(str, extra)]
    command = horovodrun_command(argv, 2)
    if supervised:
        command[3:3] = ["--max-restarts", "2"]         # python -m sample_fc.launch --max-restarts 2 -np 2 ...
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO),
                            env=single_thread_env(), start_new_session=True)


def status_of(root):
    try:
        return json.loads((root / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_for_step(job, root, step, timeout_s=240):
    """Wait until the run's status has reached `step` (it is training)."""
    deadline = time.monotonic() + timeout_s
    while status_of(root).get("step", 0) < step:
        assert job.poll() is None, f"the job ended early:\n{per_rank_tail(job.communicate()[0])}"
        if time.monotonic() > deadline:
            os.killpg(job.pid, signal.SIGKILL)
            raise AssertionError(f"no step {step} after {timeout_s} s:\n{per_rank_tail(job.communicate()[0])}")
        time.sleep(0.2)


def finish(job, timeout_s=GRACE_S + 20):
    """(exit code, output, seconds) of a job told to stop; killed (a failure) if it does not end."""
    start_time = time.monotonic()
    try:
        output, _ = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        raise AssertionError(f"the job did not stop within {timeout_s} s:\n{per_rank_tail(job.communicate()[0])}")
    return job.returncode, output, time.monotonic() - start_time


def workers(job):
    """{rank: process} of the job's train.py workers."""
    found = {}
    for process in psutil.Process(job.pid).children(recursive=True):
        try:
            if any(part.endswith("train.py") for part in process.cmdline()):
                found[int(process.environ()["HOROVOD_RANK"])] = process
        except (psutil.NoSuchProcess, KeyError):
            pass
    return found


def assert_stopped_with_checkpoint(root, code, output, seconds, signal_name="SIGTERM"):
    """The stop's record: exit 143, status stopped at step s with the complete checkpoint of s,
    the line that says how to continue, within the grace. Returns s."""
    assert code == 128 + signal.SIGTERM, per_rank_tail(output)
    assert seconds < GRACE_S, seconds
    status = status_of(root)
    assert status["state"] == "stopped" and status["signal"] == signal_name, status
    step = status["step"]
    assert status["checkpoint_step"] == step and status["checkpoint"].endswith(f"step-{step:08d}")
    assert [s for s, _ in list_checkpoints(root)][-1] == step
    assert f"stopped by {signal_name} after step {step}" in output and f"--resume {root}" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    return step


def assert_bit_identical(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_sigterm_to_the_launchers_process_group_stops_with_a_checkpoint_and_resumes_exactly(tiny_data, tmp_path):
    """Test that SIGTERM to horovodrun's process group (what a scheduler sends) stops both ranks
    after one step with its checkpoint, and that --resume from it ends bit-identical to a run
    that was never stopped."""
    root, straight = tmp_path / "stopped", tmp_path / "straight"
    job = start(root, tiny_data, *LONG)
    wait_for_step(job, root, 8)
    os.killpg(job.pid, signal.SIGTERM)
    step = assert_stopped_with_checkpoint(root, *finish(job))
    end = step + 6
    resumed = run_train(root, tiny_data, "--resume", root, "--set", f"max_update={end}")
    assert resumed.returncode == 0, per_rank_tail(resumed.output)
    assert run_train(straight, tiny_data, "--set", f"max_update={end}").returncode == 0
    assert_bit_identical(checkpoint_arrays(str(root / f"step-{end:08d}"), 2),
                         checkpoint_arrays(str(straight / f"step-{end:08d}"), 2))


def test_sigterm_to_one_worker_stops_every_rank(tiny_data, tmp_path):
    """Test that SIGTERM to rank 1 alone reaches rank 0 through the step's collective: both stop
    after the same step, rank 0 writes the checkpoint and the status."""
    root = tmp_path / "run"
    job = start(root, tiny_data, *LONG)
    wait_for_step(job, root, 8)
    workers(job)[1].send_signal(signal.SIGTERM)
    assert_stopped_with_checkpoint(root, *finish(job))


def test_sigint_to_the_launcher_stops_with_a_checkpoint(tiny_data, tmp_path):
    """Test that SIGINT to horovodrun (a terminal's Ctrl-C) stops the job as SIGTERM does (the
    launcher passes it on as SIGTERM)."""
    root = tmp_path / "run"
    job = start(root, tiny_data, *LONG)
    wait_for_step(job, root, 8)
    os.kill(job.pid, signal.SIGINT)
    assert_stopped_with_checkpoint(root, *finish(job))


def test_a_second_signal_ends_the_job_at_once_and_the_last_checkpoint_stays(tiny_data, tmp_path):
    """Test that a second SIGTERM to the launcher, while the stop's checkpoint is being written
    (made to take 6 s), ends the job at once (128 + 15, without waiting for the write): that
    checkpoint is not complete, the status says the stop was cut short, and the root resumes
    from the newest complete checkpoint."""
    root = tmp_path / "run"
    job = start(root, tiny_data, "--set", "max_update=100000", "--set", "ckpt_period=4", "--set", "ckpt_keep=100",
                fault=("slow_stop_save", 6, 0))
    wait_for_step(job, root, 9)
    os.kill(job.pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while not any(path.name.endswith(".partial") for path in root.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)                           # the stop's checkpoint is being written: the workers had
    time.sleep(SAME_STOP_S + 0.5)                  # the first signal before; the next is a second stop, not it again
    os.kill(job.pid, signal.SIGTERM)
    code, output, seconds = finish(job)
    assert code == 128 + signal.SIGTERM and seconds < 4, (seconds, per_rank_tail(output))
    assert "INJECTING" in output and "stopped at once by a second signal (SIGTERM)" in output, output[-3000:]
    status = status_of(root)
    newest = [s for s, _ in list_checkpoints(root)][-1]
    assert status["state"] == "stopped" and "ended at once" in status["error"], status
    assert newest % 4 == 0 and newest < status["step"] and status["checkpoint_step"] == newest, (newest, status)
    resumed = run_train(root, tiny_data, "--resume", root, "--set", f"max_update={newest + 2}")
    assert resumed.returncode == 0 and f"at step {newest}" in resumed.output, per_rank_tail(resumed.output)


def test_checkpoints_come_by_the_clock(tiny_data, tmp_path):
    """Test that ckpt_minutes=0.01 (0.6 s) writes a checkpoint whenever the newest is that old,
    with no step period: several checkpoints, each written 0.6 s or more after the one before."""
    root = tmp_path / "run"
    result = run_train(root, tiny_data, "--set", "max_update=60", "--set", "ckpt_period=100000",
                       "--set", "ckpt_keep=1000", "--set", "ckpt_minutes=0.01")
    assert result.returncode == 0, per_rank_tail(result.output)
    completes = [os.path.getmtime(os.path.join(path, "COMPLETE")) for _, path in list_checkpoints(root)]
    steps = [s for s, _ in list_checkpoints(root)]
    assert len(steps) >= 3 and steps[-1] == 60, (steps, per_rank_tail(result.output))
    gaps = np.diff(completes[:-1])               # the last is the end of the run's
    assert np.all(gaps >= 0.6 - 0.05), gaps


def test_the_supervisor_does_not_restart_a_stopped_run(tiny_data, tmp_path):
    """Test that SIGTERM to the restart supervisor alone is passed on once: the job stops with a
    checkpoint, exit 143, and the supervisor says it does not restart a run stopped on purpose."""
    root = tmp_path / "run"
    job = start(root, tiny_data, *LONG, supervised=True)
    wait_for_step(job, root, 8)
    os.kill(job.pid, signal.SIGTERM)
    code, output, seconds = finish(job)
    assert_stopped_with_checkpoint(root, code, output, seconds)
    assert "not restarted: the run was stopped on purpose" in output and "restart 1/" not in output, output[-3000:]


def test_a_stop_during_start_up_leaves_a_resumable_root(tiny_data, tmp_path):
    """Test that SIGTERM as soon as the run has started (status running, before its first step
    is done: the data loader and the bank are still being built) stops after the first step with
    its checkpoint, and the root resumes."""
    root = tmp_path / "run"
    job = start(root, tiny_data, *LONG)
    deadline = time.monotonic() + 120
    while status_of(root).get("state") != "running" and time.monotonic() < deadline:
        assert job.poll() is None, per_rank_tail(job.communicate()[0])
        time.sleep(0.02)
    os.killpg(job.pid, signal.SIGTERM)
    step = assert_stopped_with_checkpoint(root, *finish(job))
    assert step <= 4, step
    resumed = run_train(root, tiny_data, "--resume", root, "--set", f"max_update={step + 2}")
    assert resumed.returncode == 0 and f"at step {step}" in resumed.output, per_rank_tail(resumed.output)


def test_sigterm_to_bench_compare_alone_stops_the_training_it_launched(tiny_data, tmp_path):
    """Test that SIGTERM to bench.compare's own process (`kill PID`, not its group) stops the
    horovodrun job it started: compare exits non-zero with a line naming the signal, and none
    of the job's train.py workers is left running."""
    command = [sys.executable, "-m", "bench.compare", "--only", "sample_fc", "--set", f"rec={tiny_data}",
               *TINY_TRAIN, *LONG]
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(REPO),
                           env=single_thread_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(training := workers(job)) < 2:
            assert job.poll() is None, f"compare ended early:\n{job.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "compare started no 2-worker training in 240 s"
            time.sleep(0.2)
        time.sleep(3)
        job.send_signal(signal.SIGTERM)
        code, output, _ = finish(job)
        assert code != 0 and "compare: stopped by SIGTERM" in output, output[-3000:]
        _, alive = psutil.wait_procs(list(training.values()), timeout=10)
        assert alive == [], [p.pid for p in alive]
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)       # compare and whatever of its job is left
        except ProcessLookupError:
            pass
