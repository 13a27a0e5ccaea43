"""Shared test fixtures: paths, and a bounded-time horovodrun launcher."""
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "parallel" / "workers"
sys.path.insert(0, str(REPO))  # train.py, default.py, optimizer.py live at the top level


def package_copy(folder, scripts=("train.py",)):
    """A copy of sample_fc/ (and the top-level `scripts`) in `folder`, to edit one file of; returns the
    environment whose Python imports the copy before the repository."""
    shutil.copytree(REPO / "sample_fc", Path(folder) / "sample_fc", ignore=shutil.ignore_patterns("__pycache__"))
    for script in scripts:
        shutil.copy(REPO / script, Path(folder) / script)
    return {"PYTHONPATH": f"{folder}:{REPO}", "PATH": "/usr/bin:/bin"}


@pytest.fixture
def horovod_job():
    """Run a worker script from tests/parallel/workers under horovodrun, bounded in time."""
    from bench.harness import run_job

    def run(script, *args, num_proc=2, controller="gloo", timeout_s=240, env_extra=None):
        from bench.harness import single_thread_env
        argv = [sys.executable, str(WORKERS / script)] + [str(a) for a in args]
        env = single_thread_env(env_extra)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        result = run_job(argv, num_proc=num_proc, controller=controller, timeout_s=timeout_s,
                         env=env, cwd=str(REPO))
        assert not result.timed_out, f"job hung and was killed after {timeout_s}s:\n{per_rank_tail(result.output)}"
        return result
    return run


def per_rank_tail(output, lines=25):
    """The last `lines` lines of each rank's output (Horovod's "[N]<stdout>:" prefixes,
    "[1,N]<stdout>:" under MPI), then the launcher's own last lines: a failing rank's
    traceback stays visible even when another rank printed more after it. A rank that
    crashed keeps its whole fault report (PYTHONFAULTHANDLER: every thread's stack, the
    crashing one first), which is longer than `lines`."""
    by_rank = {}
    for line in output.splitlines():
        match = re.match(r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:", line)
        by_rank.setdefault(match.group(1) if match else "launcher", []).append(line)
    shown = {}
    for key, kept in by_rank.items():
        crash = next((n for n, line in enumerate(kept) if "Fatal Python error" in line), None)
        shown[key] = kept[min(crash, len(kept) - lines):] if crash is not None else kept[-lines:]
    return "\n".join(f"--- {'rank ' + key if key != 'launcher' else key} ---\n" + "\n".join(kept)
                     for key, kept in sorted(shown.items()))


def mpi_available():
    return shutil.which("mpirun") is not None


def pytest_configure(config):
    # mxnet 1.9.1 itself triggers these on Python 3.11; they are not ours to fix.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:mxnet.*")
    config.addinivalue_line("filterwarnings", "ignore:.*distutils.*:DeprecationWarning")


@pytest.fixture
def single_process():
    """Run a worker script from tests/parallel/workers as one plain process (world size 1)."""
    import subprocess
    from bench.harness import single_thread_env

    def run(script, *args, timeout_s=180):
        result = subprocess.run([sys.executable, str(WORKERS / script)] + [str(a) for a in args],
                                capture_output=True, text=True, timeout=timeout_s,
                                env=single_thread_env(), cwd=str(REPO))
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        return result
    return run


TINY_TRAIN = ["--dataset", "demo", "--network", "mbf_small", "--set", "num_classes=16",
              "--set", "image_size=32", "--set", "embedding_size=32", "--set", "batch_size=8",
              "--set", "verify_period=0", "--set", "frequent=4", "--set", "lr=2.0",
              "--set", "lr_steps=[1000]", "--set", "data_threads=1", "--set", "sample_ratio_warmup_steps=0"]


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A tiny demo set (16 identities x 8 images, 32 px): path of its train.rec."""
    from sample_fc.tools.demo_data import make_demo
    folder = tmp_path_factory.mktemp("tiny_demo")
    make_demo(str(folder), seed=1, num_identities=16, images_per_identity=8, num_val_identities=10,
              num_pairs=40, image_size=32, progress=False)
    return str(folder / "train.rec")


def run_train(models_root, rec, *extra, num_proc=2, timeout_s=300, script=None, script_args=()):
    """train.py (or a wrapper `script` from tests/parallel/workers) on the tiny settings,
    under horovodrun, bounded in time; a hang fails the test."""
    from bench.harness import run_job
    entry = [str(WORKERS / script), *map(str, script_args), "--"] if script else [str(REPO / "train.py")]
    argv = [sys.executable, *entry, "--models-root", str(models_root), "--set", f"rec={rec}",
            *TINY_TRAIN, *map(str, extra)]
    result = run_job(argv, num_proc=num_proc, timeout_s=timeout_s, cwd=str(REPO))
    assert not result.timed_out, f"train.py hung and was killed after {timeout_s}s:\n{per_rank_tail(result.output)}"
    return result


def run_trains_together(rec, runs):
    """run_train for each {models_root: extra arguments} of `runs`, two jobs at a time (a tiny
    job leaves the cores partly idle in its start-up and collectives): {models_root: result}."""
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(runs, pool.map(lambda root: run_train(root, rec, *runs[root]), runs)))
