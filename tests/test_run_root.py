"""Tests for sample_fc.run.run_root: the models root's lock, run id and status file."""
import json
import os
import re

import pytest

from sample_fc.run import run_root
from sample_fc.errors import UsageError


def _checkpoint(root, step, run_id):
    """A complete checkpoint directory with a state.json naming its run (what list_checkpoints
    and the run id readers look at)."""
    path = root / f"step-{step:08d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"step": step, "world_size": 1, "run_id": run_id}))
    (path / "COMPLETE").write_text("{}")
    return path


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    """Test that while one RootLock holds a root, a second acquire (another open file: flock
    locks conflict within one process too) and check_not_in_use raise UsageError naming the
    root, the holder's host, pid and start time, and the way out; after release it is free."""
    root = tmp_path / "models" / "x"
    first = run_root.RootLock.acquire(str(root))
    assert not root.exists() and os.path.isfile(run_root.lock_path(str(root)))   # beside the root
    holder = json.loads(open(run_root.lock_path(str(root))).read())
    for attempt in (lambda: run_root.RootLock.acquire(str(root)), lambda: run_root.check_not_in_use(str(root))):
        with pytest.raises(UsageError) as error:
            attempt()
        message = str(error.value)
        assert message.startswith(f"{root} is in use by a run started {holder['started'][11:16]} on host ")
        assert f"(pid {os.getpid()}); wait for it, or use --models-root" in message
    first.release()
    run_root.check_not_in_use(str(root))
    run_root.RootLock.acquire(str(root)).release()


def test_the_supervisors_token_lets_its_own_job_in(tmp_path):
    """Test that a lock held with a token admits a job presenting that token (the restart
    supervisor holding the root between attempts) and refuses one with another token."""
    root = str(tmp_path / "x")
    supervisor = run_root.RootLock.acquire(root, token="abc")
    job = run_root.RootLock.acquire(root, token="abc")
    assert job.held_for_us and job.handle is None
    run_root.check_not_in_use(root, token="abc")
    with pytest.raises(UsageError, match="is in use"):
        run_root.RootLock.acquire(root, token="other")
    job.release()
    supervisor.release()


def test_status_is_updated_atomically_and_keeps_earlier_fields(tmp_path):
    """Test that write_status merges fields into status.json, stamps the update, refuses an
    unknown state, and that read_status gives None for a missing or damaged file."""
    root = tmp_path / "x"
    root.mkdir()
    assert run_root.read_status(str(root)) is None
    run_root.write_status(str(root), run_id="r1", state="running", step=0)
    status = run_root.write_status(str(root), step=20, checkpoint_step=20)
    assert (status["run_id"], status["state"], status["step"], status["checkpoint_step"]) == ("r1", "running", 20, 20)
    assert run_root.read_status(str(root)) == status and "updated" in status
    with pytest.raises(ValueError, match="state must be one of"):
        run_root.write_status(str(root), state="paused")
    assert [p.name for p in root.iterdir()] == ["status.json"]          # no temporary left
    (root / "status.json").write_text("{not json")
    assert run_root.read_status(str(root)) is None


def test_run_ids_select_the_checkpoints_of_one_run(tmp_path):
    """Test that checkpoints_of_run keeps only the given run's checkpoints (all for None, a
    root saved before run ids) and one whose state.json no longer reads (the resume names it
    damaged rather than passing over it unsaid), and that run_id_of prefers the status, then
    the newest checkpoint."""
    root = tmp_path / "x"
    _checkpoint(root, 10, "old")
    _checkpoint(root, 20, "new")
    _checkpoint(root, 30, "old")
    assert [s for s, _ in run_root.checkpoints_of_run(str(root), "old")] == [10, 30]
    assert [s for s, _ in run_root.checkpoints_of_run(str(root), "new")] == [20]
    assert [s for s, _ in run_root.checkpoints_of_run(str(root), None)] == [10, 20, 30]
    (root / "step-00000020" / "state.json").write_text('{"run_id": "new", "st')    # cut by a crashed disk
    assert [s for s, _ in run_root.checkpoints_of_run(str(root), "old")] == [10, 20, 30]
    assert run_root.run_id_of(str(root)) == "old"
    run_root.write_status(str(root), run_id="new")
    assert run_root.run_id_of(str(root)) == "new"
    assert run_root.run_id_of(str(tmp_path / "empty")) is None
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_root.new_run_id())
    assert run_root.new_run_id() != run_root.new_run_id()


def test_a_fresh_start_is_refused_and_start_over_moves_the_run_aside(tmp_path):
    """Test that check_fresh_start refuses a root with checkpoints in one line naming the run,
    its step and both ways out, accepts an empty or checkpoint-less root, and that move_aside
    renames the root after its run id (a free name each time), keeping every file."""
    root = tmp_path / "x"
    run_root.check_fresh_start(str(root))                    # nothing there
    root.mkdir()
    (root / "train.log").write_text("log")
    run_root.check_fresh_start(str(root))                    # no checkpoint: nothing to lose
    _checkpoint(root, 40, "r1")
    with pytest.raises(UsageError) as error:
        run_root.check_fresh_start(str(root))
    assert str(error.value).startswith(f"{root} holds run r1 at step 40: continue it with --resume {root}")
    assert "--start-over" in str(error.value) and "another --models-root" in str(error.value)
    moved = run_root.move_aside(str(root))
    assert moved == f"{root}.r1" and not root.exists()
    assert sorted(os.listdir(moved)) == ["step-00000040", "train.log"]
    _checkpoint(root, 40, "r1")
    assert run_root.move_aside(str(root)) == f"{root}.r1-2"


def test_network_now_renames_only_the_old_mbf(tmp_path):
    """Test that resume.network_now maps a checkpoint saved as 'mbf' whose backbone has the
    paper's 64-channel stem to 'mbf_small' with one note, and leaves a 'mbf' of today's width
    (stem 128), other networks and an unreadable symbol file alone."""
    from sample_fc import symbols
    from sample_fc.run import resume
    from sample_fc.checkpoint.layout import symbol_path
    notes = []
    for name, stem in (("mbf_small", 64), ("mbf", 128), ("r18", 64)):
        checkpoint = tmp_path / name
        checkpoint.mkdir()
        with open(symbol_path(str(checkpoint)), "w") as handle:
            handle.write(symbols.get_symbol(name, 16, 32).tojson())
        assert resume.stem_channels(str(checkpoint)) == stem
    old = resume.network_now(str(tmp_path / "mbf_small"), {"network": "mbf", "lr": 0.1}, notes.append)
    assert old == {"network": "mbf_small", "lr": 0.1} and len(notes) == 1 and "'mbf_small'" in notes[0]
    assert resume.network_now(str(tmp_path / "mbf"), {"network": "mbf"}, notes.append) == {"network": "mbf"}
    assert resume.network_now(str(tmp_path / "r18"), {"network": "r18"}, notes.append) == {"network": "r18"}
    (tmp_path / "broken").mkdir()
    assert resume.network_now(str(tmp_path / "broken"), {"network": "mbf"}, notes.append) == {"network": "mbf"}
    assert len(notes) == 1
