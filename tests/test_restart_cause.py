"""Tests for sample_fc.run.restart's cause of a failed attempt: read from the attempt's status.json
and its exit code, never from the job's output."""
import json
import signal
import sys
import textwrap

from sample_fc.run.restart import failure_cause, read_run, supervise


def _job(tmp_path, body):
    """A stand-in for horovodrun's job under supervise: it counts its attempts in
    tmp_path/attempts, and `body` may call report(**status) to write the run file and a
    hand-written status.json of this attempt (as rank 0 does), then exits as it says."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent("""\
        import json, os, pathlib, sys
        folder = pathlib.Path(sys.argv[1])
        count = folder / "attempts"
        n = int(count.read_text()) + 1 if count.exists() else 1
        count.write_text(str(n))
        root = folder / "root"

        def report(**status):
            root.mkdir(exist_ok=True)
            status.setdefault("attempt", os.environ["SAMPLE_FC_ATTEMPT"])
            (root / "status.json").write_text(json.dumps(status))
            pathlib.Path(os.environ["SAMPLE_FC_RUN_FILE"]).write_text(
                json.dumps({"models_root": str(root), "run_id": "r1"}))
        """) + textwrap.dedent(body))
    return [sys.executable, str(path), str(tmp_path)]


def _attempts(tmp_path):
    return int((tmp_path / "attempts").read_text())


def test_the_cause_is_the_error_the_attempt_recorded():
    """Test that the supervisor takes the cause from status.json: a failed status's error (one
    that repeats unless rank 0 only saw another rank's failure), a running one (a rank was
    killed or hung: no error, retried), none (the attempt ended before its run started)."""
    failed = {"state": "failed", "error": "loss is NaN at step 7", "error_is_cause": True}
    assert failure_cause(1, failed) == ("exit code 1, loss is NaN at step 7", True)
    assert failure_cause(1, dict(failed, error_is_cause=False)) == ("exit code 1, loss is NaN at step 7", False)
    cause, repeats = failure_cause(137, {"state": "running", "error": None})
    assert cause.startswith("exit code 137 (no error recorded: a rank was killed or hung") and not repeats
    cause, repeats = failure_cause(1, None)
    assert cause.startswith("exit code 1 (no status from this attempt") and not repeats


def test_a_status_from_an_earlier_attempt_is_not_this_ones(tmp_path):
    """Test that read_run gives the root's status (where the run stands) and, as the attempt's
    own, only a status that names that attempt."""
    root = tmp_path / "root"
    root.mkdir()
    status = {"state": "failed", "error": "boom", "checkpoint_step": 20, "attempt": "1-aaaa"}
    (root / "status.json").write_text(json.dumps(status))
    (tmp_path / "run.json").write_text(json.dumps({"models_root": str(root), "run_id": "r1"}))
    assert read_run(str(tmp_path / "run.json"), "1-aaaa") == (str(root), "r1", status, status)
    assert read_run(str(tmp_path / "run.json"), "2-bbbb") == (str(root), "r1", status, None)
    assert read_run(str(tmp_path / "missing.json"), "1-aaaa") == (None, None, None, None)


def test_the_same_recorded_error_twice_from_one_checkpoint_stops(tmp_path, capsys):
    """Test that a job recording the same error every time, from the same checkpoint, is
    restarted once and then stopped, naming the error."""
    job = _job(tmp_path, """\
        report(state="failed", error="rank 0 is out of luck", error_is_cause=True, checkpoint_step=10)
        sys.exit(1)
        """)
    before = signal.getsignal(signal.SIGTERM)
    assert supervise(job, max_restarts=5) == 1
    assert _attempts(tmp_path) == 2
    assert signal.getsignal(signal.SIGTERM) is before      # the supervisor gives its signals back
    err = capsys.readouterr().err
    assert "restart 1/5 after exit code 1, rank 0 is out of luck; resuming from step 10 in " in err
    assert "not restarted: the same error twice in a row from the same checkpoint" in err


def test_the_jobs_output_is_not_read(tmp_path, capsys):
    """Test that an error line the job prints but does not record (its status still running: a
    rank was killed) is not taken for the cause: every attempt is retried up to the limit."""
    job = _job(tmp_path, """\
        report(state="running", error=None, checkpoint_step=10)
        print("[0]<stderr>:train.py: error: rank 0 is out of luck", flush=True)
        print("horovodrun: process 0 exited first, with code 1; the job was stopped", flush=True)
        sys.exit(1)
        """)
    assert supervise(job, max_restarts=2) == 1
    assert _attempts(tmp_path) == 3
    err = capsys.readouterr().err
    assert "out of luck" not in err and "the same error twice" not in err
    assert "giving up after 2 restart(s): exit code 1 (no error recorded: a rank was killed or hung" in err


def test_a_stale_failed_status_is_not_reused(tmp_path, capsys):
    """Test that when a later attempt ends before writing its status, the failure an earlier
    attempt recorded (still in status.json) is neither its cause nor a repeat of it."""
    job = _job(tmp_path, """\
        if n == 1:
            report(state="failed", error="boom", error_is_cause=True, checkpoint_step=10)
        sys.exit(1)
        """)
    assert supervise(job, max_restarts=2) == 1
    assert _attempts(tmp_path) == 3
    err = capsys.readouterr().err
    assert "restart 1/2 after exit code 1, boom; resuming from step 10" in err
    assert "restart 2/2 after exit code 1 (no status from this attempt" in err
    assert "the same error twice" not in err


def test_another_ranks_failure_seen_by_rank_0_is_retried(tmp_path, capsys):
    """Test that the same shutdown line twice (rank 0 saw another rank's failure: error_is_cause
    false) does not stop the restarts."""
    job = _job(tmp_path, """\
        report(state="failed", error="Horovod shut the job down", error_is_cause=False, checkpoint_step=10)
        sys.exit(0 if n >= 3 else 1)
        """)
    assert supervise(job, max_restarts=5) == 0
    assert _attempts(tmp_path) == 3
    assert "the same error twice" not in capsys.readouterr().err
