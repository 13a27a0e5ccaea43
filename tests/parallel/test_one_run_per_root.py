"""Test that a models root holds one run: a second job into a running root is refused, a fresh
start never overwrites a finished run, and the run's status file tells where it stands."""
import hashlib
import json
import subprocess
import sys
import time

from conftest import REPO, TINY_TRAIN, per_rank_tail, run_train
from sample_fc.checkpoint import list_checkpoints, read_state
from bench.harness import horovodrun_command, single_thread_env


def _digest(folder):
    """{file name: sha256} of every file of a checkpoint directory."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _one_error_line(result):
    lines = [line for line in result.output.splitlines() if "train.py: error:" in line]
    assert len(lines) == 1 and "Traceback" not in result.output, per_rank_tail(result.output)
    return lines[0]


def test_a_second_job_into_a_running_root_is_refused(tiny_data, tmp_path):
    """Test that while a job trains into a root, the same command started again exits 2 within
    60 s with one line naming the holder (no traceback) and changes nothing; the first job
    finishes with exit 0, its train.log holds one run and every checkpoint is its own."""
    root = tmp_path / "m"
    argv = [sys.executable, str(REPO / "train.py"), "--models-root", str(root), "--set", f"rec={tiny_data}",
            *TINY_TRAIN, "--set", "max_update=120", "--set", "ckpt_period=60"]
    first = subprocess.Popen(horovodrun_command(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=single_thread_env(), cwd=str(REPO), start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (root / "status.json").exists():          # the first job owns the root now
            assert first.poll() is None and time.monotonic() < deadline, "the first job did not start"
            time.sleep(0.5)
        config = (root / "config.json").read_bytes()
        second = run_train(root, tiny_data, "--set", "max_update=120", timeout_s=120)
        assert second.returncode == 2 and second.seconds < 60, per_rank_tail(second.output)
        print(f"\nSECOND refused after {second.seconds:.1f} s")
        line = _one_error_line(second)
        assert f"{root} is in use by a run started " in line and "wait for it, or use --models-root" in line
        assert (root / "config.json").read_bytes() == config       # the first run's, untouched
        output, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, per_rank_tail(output)
    log = (root / "train.log").read_text()
    assert log.count("world size 2") == 1, log[-3000:]
    status = json.loads((root / "status.json").read_text())
    assert (status["state"], status["step"], status["checkpoint_step"]) == ("done", 120, 120), status
    assert json.loads((root / "config.json").read_text())["run_id"] == status["run_id"]
    assert {read_state(path)["run_id"] for _, path in list_checkpoints(root)} == {status["run_id"]}


def test_a_fresh_start_never_overwrites_a_finished_run(tiny_data, tmp_path):
    """Test that a fresh start into a root holding a finished run is refused in one line naming
    the run and what to do, leaving its newest checkpoint byte-identical; --start-over moves the
    old run aside (byte-identical, named in the log) and trains a new run with a new id."""
    root = tmp_path / "m"
    assert run_train(root, tiny_data, "--set", "max_update=8").returncode == 0
    old_id = json.loads((root / "status.json").read_text())["run_id"]
    newest = list_checkpoints(root)[-1][1]
    kept = _digest(root / "step-00000008")

    refused = run_train(root, tiny_data, "--set", "max_update=8")
    assert refused.returncode == 2, per_rank_tail(refused.output)
    line = _one_error_line(refused)
    assert f"{root} holds run {old_id} at step 8: continue it with --resume {root}" in line
    assert _digest(root / "step-00000008") == kept and list_checkpoints(root)[-1][1] == newest

    again = run_train(root, tiny_data, "--set", "max_update=4", "--start-over")
    assert again.returncode == 0, per_rank_tail(again.output)
    aside = tmp_path / f"m.{old_id}"
    assert f"the run that was in {root} is now in {aside}" in again.output
    assert _digest(aside / "step-00000008") == kept
    new_id = json.loads((root / "status.json").read_text())["run_id"]
    assert new_id != old_id and [s for s, _ in list_checkpoints(root)] == [4]
    assert read_state(list_checkpoints(root)[-1][1])["run_id"] == new_id
