"""Test that train.py runs as users launch it: plain horovodrun (Gloo, MPI), mpirun,
horovodrun.sh; the demo data is built on first use; mistakes are one line, nothing written."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, mpi_available, per_rank_tail
from bench.harness import run_bounded, single_thread_env

VENV_BIN = Path(sys.executable).parent
HOROVODRUN = str(VENV_BIN / "horovodrun")
TRAIN = str(REPO / "train.py")
SHORT = ["--set", "max_update=2", "--set", "frequent=1"]


def run(command, cwd, timeout_s=240):
    result = run_bounded([str(c) for c in command], timeout_s=timeout_s, env=single_thread_env(), cwd=str(cwd))
    assert not result.timed_out, f"hung, killed after {timeout_s} s:\n{per_rank_tail(result.output)}"
    return result


def controllers():
    return ["--gloo"] + (["--mpi"] if mpi_available() else [])


@pytest.mark.parametrize("controller", controllers())
def test_plain_horovodrun_with_network_builds_the_demo_and_trains(tmp_path, controller):
    """Test that the product's own line, `horovodrun -np 2 -H localhost:2 python train.py
    --network mbf` (and `--net=mbf`), is accepted, builds the demo data once in the working
    directory, trains, and writes its checkpoint under models/demo_mbf."""
    spelling = ["--network", "mbf"] if controller == "--gloo" else ["--net=mbf"]
    result = run([HOROVODRUN, "-np", "2", "-H", "localhost:2", controller, sys.executable, TRAIN,
                  *spelling, *SHORT], tmp_path)
    assert result.returncode == 0, per_rank_tail(result.output)
    assert result.output.count("building the demo dataset") == 1, result.output
    assert (tmp_path / "data" / "demo" / "demo_val.bin").is_file()
    assert (tmp_path / "models" / "demo_mbf" / "step-00000002" / "COMPLETE").is_file()
    assert "final demo_val: accuracy" in result.output


@pytest.mark.skipif(not mpi_available(), reason="OpenMPI's mpirun is not installed")
def test_mpirun_runs_train_py(tmp_path):
    """Test that raw `mpirun -np 2 python train.py ...` (the original toolkit's route) trains
    2 ranks that see each other (world size 2 in the log) and checkpoints."""
    result = run(["mpirun", "--allow-run-as-root", "-np", "2", sys.executable, TRAIN,
                  "--models-root", "out", *SHORT], tmp_path)
    assert result.returncode == 0, per_rank_tail(result.output)
    assert "world size 2" in result.output
    assert (tmp_path / "out" / "step-00000002" / "COMPLETE").is_file()


MISTAKES = {
    "missing rec": (["--set", "rec=nowhere/train.rec"], "record file (.rec) not found: nowhere/train.rec"),
    "unknown key": (["--set", "bogus_key=1"], "unknown config key 'bogus_key'"),
    "more workers than classes": (["--dataset", "synthetic_1m", "--set", "num_classes=2"],
                                  "num_classes=2 is less than the 3 workers"),
    "bad resume path": (["--resume", "no_such_run"], "--resume no_such_run: no complete checkpoint"),
}


@pytest.mark.parametrize("controller", controllers())
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_mistake_is_one_line_and_writes_nothing(tmp_path, mistake, controller):
    """Test that an anticipated mistake prints one `train.py: error:` line naming the bad
    value, once for the whole job, no traceback, exit code 2, and no models root."""
    extra, message = MISTAKES[mistake]
    result = run([HOROVODRUN, "-np", "3", "-H", "localhost:3", controller, sys.executable, TRAIN,
                  "--models-root", "out", *extra], tmp_path, timeout_s=120)
    assert result.returncode == 2, per_rank_tail(result.output)
    errors = [line for line in result.output.splitlines() if "train.py: error:" in line]
    assert len(errors) == 1 and message in errors[0], result.output
    assert "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_horovodrun_sh_keeps_the_callers_directory(tmp_path):
    """Test that ./horovodrun.sh, run from another directory, resolves --models-root and the
    demo data against that directory, not the repository."""
    result = run([REPO / "horovodrun.sh", "-np", "2", "--models-root", "mine", *SHORT], tmp_path)
    assert result.returncode == 0, per_rank_tail(result.output)
    assert "horovodrun.sh: layout" not in result.output       # -np as typed: no layout chosen
    assert (tmp_path / "mine" / "step-00000002" / "COMPLETE").is_file()
    assert (tmp_path / "data" / "demo" / "train.rec").is_file()
    assert not (REPO / "mine").exists()


def test_concurrent_first_uses_build_the_demo_once(tmp_path):
    """Test that two processes asking for the demo data at once both get a complete set and
    only one builds it (the other waits on the lock), with no temporary folder left over."""
    code = ("import sys; from sample_fc.tools.demo_data import ensure_demo; "
            "print('BUILT' if ensure_demo(sys.argv[1], log=lambda _: None) else 'FOUND')")
    import subprocess
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "demo")], stdout=subprocess.PIPE,
                              text=True, env=single_thread_env()) for _ in range(2)]
    outputs = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs == ["BUILT", "FOUND"]
    assert sorted(os.listdir(tmp_path)) == [".demo.lock", "demo"]
    assert sorted(os.listdir(tmp_path / "demo")) == ["demo_val.bin", "property", "train.idx", "train.rec"]
    shutil.rmtree(tmp_path / "demo")


def test_horovodrun_sh_without_np_trains_in_the_measured_layout(tmp_path):
    """Test that ./horovodrun.sh with no -np says the layout it chose and trains in it: r50 at
    64 px (nearest in cost to r50 at 112 px, measured fastest as 1 worker on 2 cores) as 1
    worker of twice the per-worker batch, the global batch kept (config.json); and that a
    resume of that run is laid out as its 1 worker (`train.py --print-layout`, what the
    launcher asks). (The demo as 2 workers: the README test; -np as typed: the test above.)"""
    cores_measured = os.cpu_count() == 2
    tiny = ["--network", "r50", "--set", "image_size=64", "--set", "batch_size=2", "--set", "verify_period=0", "--set", "val_targets=[]"]  # no verification: r50 embeds demo_val in ~50 s here
    big = run([REPO / "horovodrun.sh", "--models-root", "r50", *tiny, *SHORT], tmp_path)
    assert big.returncode == 0, per_rank_tail(big.output)
    config = json.loads((tmp_path / "r50" / "config.json").read_text())
    if cores_measured:
        assert "horovodrun.sh: layout 1 worker x 2 threads, batch_size 4 (the global batch 4 kept)" in big.output
        assert "world size 1" in big.output and config["batch_size"] == 4, big.output
    resumed = run([REPO / ".venv/bin/python", REPO / "train.py", "--resume", "r50", "--print-layout"], tmp_path)
    assert resumed.returncode == 0, resumed.output
    layout = json.loads(resumed.output.strip().splitlines()[-1])
    assert layout["np"] == (1 if cores_measured else 2) and "the world size the resumed run was trained with" in layout["line"]
