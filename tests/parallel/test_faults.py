"""Fault injection under 2 Gloo workers: bad input, a failing, killed or hung rank, NaN, a
kill during checkpointing. Every case must end quickly with a clear message and leave the
checkpoint directory usable. Each test prints the observed time to exit."""
import os
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import pytest

from conftest import per_rank_tail, run_train
from sample_fc.run.run_root import read_progress, read_status
from sample_fc.checkpoint import list_checkpoints, model_prefix

EXIT_BOUND_S = 60       # a failing job must be over within this after the fault


def _fails(result, *messages, mistake=False):
    """The job failed with `messages` in its output; a `mistake` (config, data, checkpoint)
    exits 2 with `train.py: error:` lines and no traceback."""
    assert result.returncode != 0, per_rank_tail(result.output)
    if mistake:
        assert result.returncode == 2 and "train.py: error:" in result.output, per_rank_tail(result.output)
        assert "Traceback" not in result.output, per_rank_tail(result.output)
    for message in messages:
        assert message in result.output, f"{message!r} not in output:\n{per_rank_tail(result.output)}"
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
    print(f"\nFAULT {test}: exit code {result.returncode} after {result.seconds:.1f} s")
    assert result.seconds < EXIT_BOUND_S + 30      # + start-up of two MXNet processes


def _copy_data(tiny_data, tmp_path):
    folder = tmp_path / "data"
    shutil.copytree(os.path.dirname(tiny_data), folder)
    return folder


def test_missing_rec(tmp_path):
    """Test that a missing .rec is named in the error."""
    _fails(run_train(tmp_path / "m", tmp_path / "nowhere" / "train.rec"), "nowhere/train.rec", mistake=True)


def test_missing_idx(tiny_data, tmp_path):
    """Test that a missing .idx next to the .rec is named in the error."""
    folder = _copy_data(tiny_data, tmp_path)
    os.remove(folder / "train.idx")
    _fails(run_train(tmp_path / "m", folder / "train.rec"), "train.idx", mistake=True)


def test_property_mismatch(tiny_data, tmp_path):
    """Test that num_classes disagreeing with the dataset's property names both values."""
    _fails(run_train(tmp_path / "m", tiny_data, "--set", "num_classes=20"), "num_classes=20", "says 16", mistake=True)


def test_label_out_of_range(tiny_data, tmp_path):
    """Test that a label >= num_classes fails while reading, naming the record and the label."""
    folder = _copy_data(tiny_data, tmp_path)
    (folder / "property").write_text("12,32,32")
    _fails(run_train(tmp_path / "m", folder / "train.rec", "--set", "num_classes=12"),
           "outside [0, 12)", "record key", mistake=True)


def test_unreadable_image(tiny_data, tmp_path):
    """Test that an image that cannot be decoded fails with its record key."""
    import mxnet.recordio as recordio
    folder = _copy_data(tiny_data, tmp_path)
    reader = recordio.MXIndexedRecordIO(str(folder / "train.idx"), str(folder / "train.rec"), "r")
    offset = reader.idx[5]
    reader.close()
    with open(folder / "train.rec", "r+b") as handle:     # keep the record header, garble the JPEG
        handle.seek(offset + 8 + 24 + 4)
        handle.write(b"\x00" * 64)
    _fails(run_train(tmp_path / "m", folder / "train.rec", "--set", "max_update=40"),
           "record key 5", "cannot decode image", mistake=True)


def test_shard_smaller_than_batch(tiny_data, tmp_path):
    """Test that a per-rank shard smaller than one batch is refused with the sizes."""
    _fails(run_train(tmp_path / "m", tiny_data, "--set", "batch_size=100"), "fewer than batch_size=100", mistake=True)


def test_fewer_classes_than_workers(tiny_data, tmp_path):
    """Test that num_classes < world size is refused."""
    _fails(run_train(tmp_path / "m", tiny_data, "--set", "synthetic=true", "--set", "num_classes=1"),
           "num_classes=1 is less than the 2 workers", mistake=True)


def test_bad_sample_ratio(tiny_data, tmp_path):
    """Test that sample_ratio outside (0, 1] is refused, naming the value."""
    _fails(run_train(tmp_path / "m", tiny_data, "--set", "sample_ratio=1.5"), "sample_ratio", "1.5", mistake=True)


def test_resume_with_other_embedding_size(tiny_data, tmp_path):
    """Test that resuming a checkpoint with a different embedding size names both sizes."""
    assert run_train(tmp_path / "a", tiny_data, "--set", "max_update=2").returncode == 0
    _fails(run_train(tmp_path / "b", tiny_data, "--set", "max_update=4", "--set", "embedding_size=64",
                     "--resume", tmp_path / "a"), "embedding_size=32", "embedding_size=64", mistake=True)


def _assert_checkpoints_usable(root, steps):
    assert [s for s, _ in list_checkpoints(root)] == steps
    for step, path in list_checkpoints(root):
        mx.model.load_checkpoint(model_prefix(path), step)


@pytest.mark.parametrize("kind, message", [("raise", "injected fault on rank 1"),
                                           ("sigkill", "INJECTING sigkill")])
def test_rank_failure_mid_training_ends_the_job(tiny_data, tmp_path, kind, message):
    """Test that one rank raising or being SIGKILLed mid-training ends the whole job quickly,
    non-zero, with the completed checkpoint intact."""
    result = run_train(tmp_path / "m", tiny_data, "--set", "max_update=40", "--set", "ckpt_period=4",
                       script="faulty_train.py", script_args=(kind, 6, 1))
    _fails(result, message)
    _assert_checkpoints_usable(tmp_path / "m", [4])


def test_a_hung_rank_ends_the_job_after_collective_timeout(tiny_data, tmp_path):
    """Test that a rank hanging outside any collective (rank 0, Horovod's coordinator, or
    rank 1) ends the job non-zero soon after collective_timeout_s: Horovod's stall report
    names the missing rank, the waiting rank says why it stops, the checkpoint stays usable.
    Under Gloo this needs scripts/patch_horovod.py (without it the job hangs forever). The
    limit is 15 s, not less, so that start-up skew between ranks on a loaded machine cannot
    trip it before the fault. The hung rank, stopped by the launcher while it sleeps, ends after
    its stop_grace_s (5 s here, 25 by default). The job has ended within the limit, a few of
    Horovod's 1 s checks (dist.STALL_CHECKS_PER_LIMIT), that grace and a few seconds more, from
    the hang's own clock reading (with the check at half the limit the shutdown alone took 34 s).
    The two jobs (rank 0 hung, rank 1 hung) run at the same time: each spends most of its
    time waiting for the timeouts."""
    def hang(hung_rank):
        result = run_train(tmp_path / f"m{hung_rank}", tiny_data, "--set", "max_update=40", "--set", "ckpt_period=4",
                           "--set", "collective_timeout_s=15", "--set", "stop_grace_s=5",
                           script="faulty_train.py", script_args=("hang", 6, hung_rank))
        return result, time.time()
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(hang, (0, 1)))
    for hung_rank, (result, ended_at) in enumerate(results):
        waiting_rank = 1 - hung_rank
        _fails(result, f"INJECTING hang on rank {hung_rank}", f"{hung_rank}!: [",
               "is stalled for longer than 15 seconds",
               f"train.py: error: rank {waiting_rank} lost rank {hung_rank} in a collective (step 7, stage ",
               "it failed, or sent nothing for collective_timeout_s=15 s")
        _assert_checkpoints_usable(tmp_path / f"m{hung_rank}", [4])
        hung_at = float(re.search(r"INJECTING hang .*\(unix time ([\d.]+)\)", result.output).group(1))
        assert 15 <= ended_at - hung_at <= 15 + 3 + 5 + 8, (ended_at - hung_at, per_rank_tail(result.output))


def test_nan_on_one_rank_is_skipped(tiny_data, tmp_path):
    """Test that NaN features on one rank skip that step on all ranks and training goes on."""
    result = run_train(tmp_path / "m", tiny_data, "--set", "max_update=8",
                       script="faulty_train.py", script_args=("nan", 3, 1))
    assert result.returncode == 0, per_rank_tail(result.output)
    assert "non-finite loss or gradients after update 3: step skipped" in result.output
    _assert_checkpoints_usable(tmp_path / "m", [8])


def test_kill_during_checkpoint_save_then_resume(tiny_data, tmp_path):
    """Test that a SIGKILL while saving leaves the previous checkpoint loadable, and that
    --resume ignores the partial one and finishes the run."""
    root = tmp_path / "m"
    result = run_train(root, tiny_data, "--set", "max_update=8", "--set", "ckpt_period=4",
                       script="faulty_train.py", script_args=("kill_in_save", 8, 1))
    _fails(result, "INJECTING SIGKILL in checkpoint save")
    _assert_checkpoints_usable(root, [4])
    assert (root / "step-00000008.partial").is_dir()
    result = run_train(root, tiny_data, "--set", "max_update=8", "--set", "ckpt_period=4", "--resume", root)
    assert result.returncode == 0, per_rank_tail(result.output)
    assert "at step 4" in result.output
    _assert_checkpoints_usable(root, [4, 8])


def _one_error_line(result):
    lines = [line for line in result.output.splitlines() if "train.py: error:" in line]
    assert len(lines) == 1 and "Traceback" not in result.output, per_rank_tail(result.output)
    return lines[0]


def test_disk_full_during_save_keeps_the_previous_checkpoint(tiny_data, tmp_path):
    """Test that a bank shard write failing with ENOSPC on rank 1 ends the job on every rank
    with one line (the path, the space needed and free), removes the partial checkpoint and
    leaves the previous one loadable."""
    root = tmp_path / "m"
    result = run_train(root, tiny_data, "--set", "max_update=12", "--set", "ckpt_period=4",
                       script="faulty_train.py", script_args=("enospc_in_save", 8, 1))
    _fails(result, "INJECTING ENOSPC")
    assert result.returncode == 1
    line = _one_error_line(result)
    for part in ("cannot write checkpoint", "step-00000008", "No space left on device",
                 "a checkpoint needs about", "MB are free", "step-00000004"):
        assert part in line, line
    assert not list(root.glob("*.partial"))
    _assert_checkpoints_usable(root, [4])


def test_too_small_disk_stops_at_start_up(tiny_data, tmp_path):
    """Test that a models root whose file system cannot hold one checkpoint stops the run
    before training, with one line and exit 2, and nothing written."""
    root = tmp_path / "m"
    result = run_train(root, tiny_data, script="faulty_train.py", script_args=("small_disk", 1000, 0))
    assert result.returncode == 2, per_rank_tail(result.output)
    assert "not enough space for checkpoints" in _one_error_line(result)
    assert not root.exists()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 12 MB tmpfs (root only; skipped where mounting is not allowed)."""
    import subprocess
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_real_full_disk_keeps_the_previous_checkpoint(tiny_data, small_tmpfs):
    """Test on a real 12 MB file system: the first checkpoint (~7 MB) fits, the second does
    not (the first is kept until the second completes), and the job ends in one line with
    no .partial left and the first checkpoint loadable; once the file system has grown,
    `--resume` continues from that checkpoint to the end."""
    import subprocess
    root = small_tmpfs / "m"
    result = run_train(root, tiny_data, "--set", "max_update=8", "--set", "ckpt_period=4",
                       "--set", "ckpt_keep=1", "--set", "embedding_size=128")
    assert result.returncode == 1, per_rank_tail(result.output)
    line = _one_error_line(result)
    assert "cannot write checkpoint" in line and "step-00000008" in line, line
    assert not list(root.glob("*.partial"))
    _assert_checkpoints_usable(root, [4])
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    resumed = run_train(root, tiny_data, "--resume", str(root), "--set", "max_update=12",
                        "--set", "embedding_size=128")
    assert resumed.returncode == 0 and "resumed from" in resumed.output, per_rank_tail(resumed.output)
    _assert_checkpoints_usable(root, [12])


def test_a_paused_rank_is_ridden_out_within_the_limit_and_named_beyond_it(tiny_data, tmp_path):
    """Test a rank whose whole process stops (SIGSTOP, as a swap storm, a loaded node or a
    debugger does) and comes back (SIGCONT): paused 4 s mid-run under a 12 s limit, the run goes
    on to its final step with the losses of an undisturbed run; paused 30 s as its bank is
    built at start, the job ends non-zero soon after the limit in one line naming the paused rank,
    what the waiting one was doing and the key to raise, and no traceback or native crash (the
    paused rank, still stopped when the launcher ends the job, is killed).
    The three jobs run two at a time (the undisturbed one beside the short pause)."""
    common = ("--set", "max_update=12", "--set", "collective_timeout_s=12", "--set", "stop_grace_s=5")
    with ThreadPoolExecutor(2) as pool:
        plain, short = pool.map(lambda args: run_train(tmp_path / args[0], tiny_data, *common, **args[1]),
                                [("plain", {}), ("short", {"script": "faulty_train.py", "script_args": ("pause4", 6, 1)})])
    assert plain.returncode == 0 and short.returncode == 0, per_rank_tail(short.output)
    assert "INJECTING a 4 s pause (SIGSTOP) on rank 1" in short.output
    losses = [[r["loss"] for r in read_progress(str(tmp_path / name))] for name in ("plain", "short")]
    assert losses[0] == losses[1] and read_status(str(tmp_path / "short"))["step"] == 12
    long = run_train(tmp_path / "long", tiny_data, *common, script="faulty_train.py", script_args=("pause30", -1, 1))
    _fails(long, "INJECTING a 30 s pause (SIGSTOP) on rank 1")
    errors = [line for line in long.output.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1, per_rank_tail(long.output)
    assert errors[0].endswith("train.py: error: rank 0 lost rank 1 in a collective (at start, building the model "
                              "and the bank's initial centers): it failed, or sent nothing for collective_timeout_s=12 s (stopped, swapped out, starved "
                              "of CPU, or its node lost); --set collective_timeout_s=N (now 12) rides out longer "
                              "pauses"), errors[0]
    assert "Traceback" not in long.output and "corruption" not in long.output, per_rank_tail(long.output)
    # the launcher's last line is the reason the run recorded: the console says why whoever printed
    assert long.output.rstrip().splitlines()[-1] == (
        f"horovodrun.sh: the job failed: exit code 1, {errors[0].split('train.py: error: ')[1]} "
        f"(the run: {tmp_path / 'long'})"), per_rank_tail(long.output)
