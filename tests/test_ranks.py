"""sample_fc.ranks: the launcher's rank and local size from its environment, and each
worker's share of the cores (set before mxnet starts its threads)."""
import os
import subprocess
import sys

import pytest

from sample_fc import ranks

LAUNCHER = ranks.LAUNCHER_RANK_VARIABLES + ranks.LAUNCHER_LOCAL_SIZE_VARIABLES
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def clean_env(monkeypatch):
    for variable in LAUNCHER + ("OMP_NUM_THREADS", "MXNET_CPU_WORKER_NTHREADS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    return monkeypatch


@pytest.mark.parametrize("variable", ["HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"])
def test_each_local_worker_gets_its_share_of_the_cores(clean_env, variable):
    clean_env.setenv(variable, "2")
    ranks.share_cores()
    assert os.environ["OMP_NUM_THREADS"] == "4"
    assert os.environ["MXNET_CPU_WORKER_NTHREADS"] == "1"


def test_alone_a_worker_takes_every_core_and_more_workers_than_cores_take_one(clean_env):
    ranks.share_cores()
    assert os.environ["OMP_NUM_THREADS"] == "8"
    clean_env.delenv("OMP_NUM_THREADS")
    clean_env.setenv("HOROVOD_LOCAL_SIZE", "16")
    ranks.share_cores()
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_thread_counts_the_user_set_are_kept(clean_env):
    clean_env.setenv("HOROVOD_LOCAL_SIZE", "2")
    clean_env.setenv("OMP_NUM_THREADS", "3")
    clean_env.setenv("MXNET_CPU_WORKER_NTHREADS", "2")
    ranks.share_cores()
    assert (os.environ["OMP_NUM_THREADS"], os.environ["MXNET_CPU_WORKER_NTHREADS"]) == ("3", "2")


def test_train_py_shares_the_cores_before_mxnet_starts():
    """train.py sets the counts before its first mxnet import (MXNet reads them once)."""
    code = ("import os, sys; sys.argv = ['train.py', '--help']\n"
            "os.environ.pop('OMP_NUM_THREADS', None); os.environ.pop('MXNET_CPU_WORKER_NTHREADS', None)\n"
            "os.environ['HOROVOD_LOCAL_SIZE'] = str(os.cpu_count())\n"
            "import builtins; real = builtins.__import__; seen = {}\n"
            "def spy(name, *a, **k):\n"
            "    if name == 'mxnet' and 'omp' not in seen:\n"
            "        seen['omp'] = (os.environ.get('OMP_NUM_THREADS'), os.environ.get('MXNET_CPU_WORKER_NTHREADS'))\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = spy\n"
            "import train\n"
            "print(seen['omp'])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-1500:]
    assert result.stdout.strip().splitlines()[-1] == "('1', '1')"
