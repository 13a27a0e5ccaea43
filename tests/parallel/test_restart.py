"""Test that a job survives lost and hung workers: the step watchdog ends a hung job, and
`--max-restarts` restarts a failed one from its newest checkpoint until it finishes with
the same final state as an uninterrupted run."""
import json
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from conftest import REPO, TINY_TRAIN, WORKERS, per_rank_tail
from bench.harness import run_bounded, single_thread_env
from sample_fc.run.restart import current_hosts, replace_option
from sample_fc.run.run_root import read_progress
from test_train import checkpoint_arrays

STEPS, PERIOD = 60, 10
SOAK = ["--set", f"max_update={STEPS}", "--set", f"ckpt_period={PERIOD}", "--set", "frequent=1",
        "--set", "sample_ratio=0.5", "--set", "step_timeout_s=6", "--set", "ckpt_keep=2"]


def launch(argv, tmp_path, restarts=None, env_extra=None, timeout_s=420):
    options = ["--max-restarts", str(restarts)] if restarts is not None else []
    command = [sys.executable, "-m", "sample_fc.launch", *options, "-np", "2", "-H", "localhost:2", "--gloo",
               sys.executable, *map(str, argv)]
    env = single_thread_env(env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    result = run_bounded(command, timeout_s=timeout_s, env=env, cwd=str(tmp_path))
    assert not result.timed_out, f"hung, killed after {timeout_s} s:\n{per_rank_tail(result.output)}"
    return result


def losses_by_step(models_root):
    """{step: loss} from a run's progress records with frequent=1; a step recorded again after a
    restart keeps its last value (the run that went on from it)."""
    return {record["step"]: record["loss"] for record in read_progress(str(models_root))}


def planned_faults(seed=3):
    """3 SIGKILLs of a random rank at random updates (one inside a checkpoint save) and one
    hang of every rank, at distinct steps."""
    rng = np.random.default_rng(seed)
    kills = sorted(int(s) for s in rng.choice([s for s in range(5, STEPS - 2) if s % PERIOD], 2, replace=False))
    in_save = int(rng.choice(range(2 * PERIOD, STEPS, PERIOD)))
    hang = int(rng.choice([s for s in range(5, STEPS - 2) if s % PERIOD and s not in kills]))
    ranks = rng.integers(0, 2, 3)
    return [f"sigkill:{kills[0]}:{ranks[0]}", f"sigkill:{kills[1]}:{ranks[1]}",
            f"kill_in_save:{in_save}:{ranks[2]}", f"hang_all:{hang}"]


def test_soak_restarts_reach_the_uninterrupted_final_state(tiny_data, tmp_path):
    """Test that with 3 SIGKILLs (one in a checkpoint save) and one all-ranks hang, a job with
    --max-restarts 5 exits 0 and its final backbone, bank (weights and momentum) and per-step
    losses equal an uninterrupted run's."""
    common = [*TINY_TRAIN, "--set", f"rec={tiny_data}", *SOAK]
    faults, markers = planned_faults(), tmp_path / "markers"
    markers.mkdir()
    with ThreadPoolExecutor(1) as pool:       # the uninterrupted run trains while the soak waits out its faults
        uninterrupted = pool.submit(launch, [REPO / "train.py", "--models-root", tmp_path / "straight", *common],
                                    tmp_path)
        soak = launch([WORKERS / "soak_train.py", "--models-root", tmp_path / "soak", *common], tmp_path,
                      restarts=5, env_extra={"SAMPLE_FC_FAULTS": ",".join(faults), "SAMPLE_FC_FAULT_DIR": str(markers)})
        straight = uninterrupted.result()
    assert straight.returncode == 0, per_rank_tail(straight.output)
    assert soak.returncode == 0, per_rank_tail(soak.output)
    assert sorted(os.listdir(markers)) == sorted(
        ["hang_all-%s-rank0" % faults[3].split(":")[1], "hang_all-%s-rank1" % faults[3].split(":")[1],
         "sigkill-%s" % faults[0].split(":")[1], "sigkill-%s" % faults[1].split(":")[1],
         "kill_in_save-%s" % faults[2].split(":")[1]]), "not every fault fired"
    restarts = re.findall(r"\[restart\] restart (\d)/5 after (.*); resuming from (.*)", soak.output)
    expected = []                                 # the newest complete checkpoint at each fault
    for kind, at, *_ in sorted((f.split(":") for f in faults), key=lambda f: int(f[1])):
        newest = int(at) - PERIOD if kind == "kill_in_save" else int(at) // PERIOD * PERIOD
        expected.append(f"step {newest}" if newest else "the start")
    resumed_from = [" ".join(where.split()[:2]) for _, _, where in restarts]
    assert resumed_from == expected, restarts
    assert "made no progress" in soak.output and "stage " in soak.output      # the watchdog's line
    print("\nSOAK faults", faults, "restarts:", *restarts, sep="\n  ")
    print(re.findall(r"\[restart\] done after .*", soak.output))

    final = f"step-{STEPS:08d}"              # bit-equal: backbone, BatchNorm statistics, bank, momentum
    soak_state, straight_state = (checkpoint_arrays(str(tmp_path / run / final), 2) for run in ("soak", "straight"))
    assert sorted(soak_state) == sorted(straight_state)
    assert [k for k in soak_state if not np.array_equal(soak_state[k], straight_state[k])] == []
    soak_losses, straight_losses = (losses_by_step(tmp_path / run) for run in ("soak", "straight"))
    assert sorted(soak_losses) == list(range(1, STEPS + 1)) and soak_losses == straight_losses


def test_all_ranks_hung_ends_within_the_step_timeout(tiny_data, tmp_path):
    """Test that when every rank hangs outside a collective (Horovod's stall check cannot see
    it), the watchdog ends the job within step_timeout_s + 30 s with a line naming the rank,
    step and stage; without restarts the launcher exits non-zero."""
    markers = tmp_path / "markers"
    markers.mkdir()
    result = launch([WORKERS / "soak_train.py", "--models-root", tmp_path / "m", *TINY_TRAIN,
                     "--set", f"rec={tiny_data}", "--set", "max_update=40", "--set", "step_timeout_s=6"],
                    tmp_path, env_extra={"SAMPLE_FC_FAULTS": "hang_all:8", "SAMPLE_FC_FAULT_DIR": str(markers)})
    assert result.returncode == 1, per_rank_tail(result.output)
    assert re.search(r"train.py: error: rank \d made no progress for \d+ s \(step_timeout_s=6\) in step 9, "
                     r"stage forward", result.output), per_rank_tail(result.output)
    hung_at = result.output.index("INJECTING hang")
    assert result.seconds < 6 + 30 + 15, result.seconds          # + start-up and 8 steps
    assert hung_at >= 0


def test_a_mistake_is_not_restarted(tmp_path):
    """Test that --max-restarts does not retry a config mistake (exit 2, one line)."""
    result = launch([REPO / "train.py", "--set", "bogus=1"], tmp_path, restarts=3, timeout_s=120)
    assert result.returncode == 2
    assert "not restarted" in result.output and "restart 1/3" not in result.output
    assert "Traceback" not in result.output


def test_a_bug_keeps_its_traceback_and_is_retried(tiny_data, tmp_path):
    """Test that a ValueError that is not a usage mistake (injected in the step) keeps its
    traceback and exits 1 without restarts, and that --max-restarts retries it from the run's
    newest checkpoint (found in the run's status.json) to a finished run."""
    common = [WORKERS / "soak_train.py", "--models-root", tmp_path / "m", *TINY_TRAIN, "--set", f"rec={tiny_data}",
              "--set", "max_update=12", "--set", "ckpt_period=4"]
    envs = []
    for name in ("markers_once", "markers_retried"):       # each job's fault fires once in it
        (tmp_path / name).mkdir()
        envs.append({"SAMPLE_FC_FAULTS": "value_error:6:1", "SAMPLE_FC_FAULT_DIR": str(tmp_path / name)})
    with ThreadPoolExecutor(1) as pool:
        retrying = pool.submit(launch, [*common[:2], tmp_path / "r", *common[3:]], tmp_path, restarts=2,
                               env_extra=envs[1])
        once = launch(common, tmp_path, env_extra=envs[0], timeout_s=240)
        retried = retrying.result()
    assert once.returncode == 1, per_rank_tail(once.output)
    assert "Traceback" in once.output and "ValueError: injected bug on rank 1 at update 6" in once.output
    status = json.loads((tmp_path / "m" / "status.json").read_text())
    assert status["state"] != "done" and status["checkpoint_step"] == 4, status     # killed or failed
    assert retried.returncode == 0, per_rank_tail(retried.output)
    assert "Traceback" in retried.output
    assert re.search(r"\[restart\] restart 1/2 after exit code 1.*; resuming from step 4 in ", retried.output)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert (status["state"], status["step"], status["checkpoint_step"]) == ("done", 12, 12), status


def test_restart_keeps_the_reachable_hosts():
    """Test that a restart re-reads -H and keeps only reachable hosts with their slots."""
    args = ["-np", "4", "-H", "localhost:2,gone:2", "python", "train.py"]
    alive, listed = current_hosts(args, reachable=lambda host, _: host != "gone")
    assert alive == [("localhost", 2)] and listed == [("localhost", 2), ("gone", 2)]
    assert replace_option(args, ("-H", "--hosts"), "localhost:2")[:4] == ["-np", "4", "-H", "localhost:2"]


def _script(tmp_path, body):
    path = tmp_path / "job.py"
    path.write_text("import pathlib, sys\ncount = pathlib.Path(sys.argv[1])\n"
                    "n = int(count.read_text()) + 1 if count.exists() else 1\ncount.write_text(str(n))\n" + body)
    return [sys.executable, str(path), str(tmp_path / "attempts")]


def test_supervise_restarts_until_success_and_stops_on_a_repeated_error(tmp_path, capsys):
    """Test the restart loop alone: a job failing twice (killed, no error recorded) then
    succeeding ends 0 after 2 restarts; a job recording the same error in its status.json every
    time stops after one restart; a limit of 1 restart is respected."""
    from sample_fc.run.restart import supervise
    flaky = _script(tmp_path, "sys.exit(0 if n >= 3 else 137)\n")
    assert supervise(flaky, max_restarts=5) == 0
    assert (tmp_path / "attempts").read_text() == "3"
    (tmp_path / "attempts").unlink()
    stuck = _script(tmp_path, "import json, os\nroot = count.parent / 'root'\nroot.mkdir(exist_ok=True)\n"
                              "(root / 'status.json').write_text(json.dumps({'state': 'failed', 'error': 'rank 0 is "
                              "out of luck', 'attempt': os.environ['SAMPLE_FC_ATTEMPT']}))\n"
                              "pathlib.Path(os.environ['SAMPLE_FC_RUN_FILE']).write_text(json.dumps("
                              "{'models_root': str(root), 'run_id': 'r1'}))\nsys.exit(1)\n")
    assert supervise(stuck, max_restarts=5) == 1
    assert (tmp_path / "attempts").read_text() == "2"
    assert "the same error twice" in capsys.readouterr().err
    (tmp_path / "attempts").unlink()
    assert supervise(_script(tmp_path, "sys.exit(137)\n"), max_restarts=1) == 137
    assert (tmp_path / "attempts").read_text() == "2"
