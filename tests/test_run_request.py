"""Tests for sample_fc.run.run_request: the job's request, read once, and rank 0's status record."""
import dataclasses
import json
from argparse import Namespace

import pytest
from easydict import EasyDict

from sample_fc.run import run_root
from sample_fc.errors import UsageError
from sample_fc.run.restart import failure_cause, read_run
from sample_fc.run.run_request import RunRequest, RunStatus

TYPED = dict(models_root=None, resume=None, pretrained=None, start_over=False)


def _checkpoint(root, step, run_id):
    """A complete checkpoint directory whose state.json names its run."""
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"step": step, "world_size": 1, "run_id": run_id}))
    (path / "COMPLETE").write_text("{}")
    return path


def test_the_request_reads_the_command_line_and_the_supervisors_environment():
    """Test that RunRequest.read takes the run options from the parsed arguments and the
    supervisor's variables from the environment given (absent: not supervised), is frozen,
    and refuses --start-over with --resume."""
    args = Namespace(**dict(TYPED, models_root="m", pretrained="p,3"))
    environ = {run_root.AUTO_RESUME_ENV: "1", run_root.RUN_ID_ENV: "r1", run_root.LOCK_TOKEN_ENV: "t",
               run_root.RUN_FILE_ENV: "/tmp/run.json", run_root.ATTEMPT_ENV: "2-ab"}
    request = RunRequest.read(args, environ)
    assert request == RunRequest(models_root="m", pretrained="p,3", auto_resume=True, supervisor_run_id="r1",
                                 lock_token="t", run_file="/tmp/run.json", attempt="2-ab")
    assert RunRequest.read(args, {}) == RunRequest(models_root="m", pretrained="p,3")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.resume = "x"
    with pytest.raises(UsageError, match="--start-over begins a new run; --resume continues one"):
        RunRequest.read(Namespace(**dict(TYPED, resume="m", start_over=True)), {})


def test_the_run_id_is_decided_in_one_order(tmp_path):
    """Test that run_id takes the resumed checkpoint's id, else the supervisor's run, else the
    id of the root --resume names, else a new one; and models_root_for's choice of root."""
    root = tmp_path / "m"
    checkpoint = _checkpoint(root, 10, "root-run")
    cfg = EasyDict(dataset="demo", network="mbf_small")
    assert RunRequest(resume=str(root), supervisor_run_id="sup").run_id({"run_id": "state"}) == "state"
    assert RunRequest(resume=str(root), supervisor_run_id="sup").run_id({}) == "sup"
    assert RunRequest(resume=str(root)).run_id({}) == "root-run"
    assert RunRequest(resume=str(checkpoint)).continued_run is None          # named directly: its state says
    assert RunRequest().run_id() != RunRequest().run_id()                   # new ones
    assert RunRequest(models_root="x", resume=str(root)).models_root_for(cfg) == "x"
    assert RunRequest(resume=str(checkpoint)).models_root_for(cfg) == str(root)
    assert RunRequest().models_root_for(cfg) == "models/demo_mbf_small"


def test_a_restart_continues_its_run_and_does_not_begin_it_again(tmp_path):
    """Test that an automatic restart resumes the root (even when the command named a
    checkpoint) without --pretrained or --start-over once the supervisor's run has a
    checkpoint there, runs the command as typed while it has none, and that a request without
    auto_resume is left alone."""
    root = tmp_path / "m"
    typed = RunRequest(pretrained="p", start_over=True, auto_resume=True, supervisor_run_id="r1")
    assert typed.restarted(str(root)) == typed                                 # nothing saved yet
    _checkpoint(root, 10, "other")
    assert typed.restarted(str(root)) == typed                                 # another run's checkpoint
    _checkpoint(root, 20, "r1")
    assert typed.restarted(str(root)) == RunRequest(resume=str(root), auto_resume=True, supervisor_run_id="r1")
    named = RunRequest(resume=str(root / "step-00000010"), auto_resume=True, supervisor_run_id="r1")
    assert named.restarted(str(root)).resume == str(root)
    assert dataclasses.replace(typed, auto_resume=False).restarted(str(root)).pretrained == "p"


def test_the_status_rank_0_writes_is_what_the_supervisor_reads(tmp_path):
    """Test that RunStatus marks the run running with the attempt's id and tells the run file
    where it lives, records a failure once (the first stays), and that the supervisor reads it
    as this attempt's cause; nothing is written before start or after done."""
    root, run_file = tmp_path / "m", tmp_path / "run.json"
    root.mkdir()
    request = RunRequest(run_file=str(run_file), attempt="3-cd")
    status = RunStatus(request)
    status.failed("too early")                                  # not started: nothing written
    assert run_root.read_status(str(root)) is None
    status.start(str(root), "r1", step=0, checkpoint_step=None)
    assert json.loads(run_file.read_text()) == {"models_root": str(root), "run_id": "r1"}
    status.failed("rank 0 ran out of luck")
    status.failed("a later line")
    _, run_id, _, mine = read_run(str(run_file), "3-cd")
    assert run_id == "r1" and failure_cause(1, mine) == ("exit code 1, rank 0 ran out of luck", True)
    status.start(str(root), "r1", step=0)
    status.failed("Horovod shut the job down", is_cause=False)
    assert failure_cause(1, run_root.read_status(str(root))) == ("exit code 1, Horovod shut the job down", False)
    status.start(str(root), "r1", step=0)
    status.done(8)
    status.failed("after the end")
    assert (run_root.read_status(str(root))["state"], run_root.read_status(str(root))["error"]) == ("done", None)
