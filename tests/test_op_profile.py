"""bench/op_profile.py: a backbone step's time by operator, as MXNet's profiler counts it."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO


def run_profile(*args):
    return subprocess.run([sys.executable, "-m", "bench.op_profile", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def operators(output):
    """{operator: calls per step} of the listing."""
    return {name: float(calls) for calls, name in re.findall(r"%\s+x(\S+)\s+(\S+)", output)}


def test_the_profile_counts_each_operator_of_the_step_once_per_call():
    """mbf_small at 32 px: its 33 PReLUs are our fused operator, called 33 times a step forward and
    33 backward; without fusing they are MXNet's relu (33 a step) and the fused one is absent."""
    fused = run_profile("--network", "mbf_small", "--image-size", "32", "--batch", "4", "--steps", "2", "--top", "60")
    assert fused.returncode == 0, fused.stderr[-2000:]
    ops = operators(fused.stdout)
    assert ops["sample_fc_prelu"] == 33 and ops["_backward_sample_fc_prelu"] == 33
    assert "relu" not in ops
    plain = run_profile("--network", "mbf_small", "--image-size", "32", "--batch", "4", "--steps", "2", "--top", "60",
                        "--no-fuse")
    assert plain.returncode == 0, plain.stderr[-2000:]
    ops = operators(plain.stdout)
    assert ops["relu"] == 33 and not any(name.startswith(("sample_fc", "_backward_sample_fc")) for name in ops)
    assert "MXNet's composite operators" in plain.stdout


def test_a_count_below_one_is_one_line():
    result = run_profile("--network", "mbf_small", "--threads", "0")
    assert result.returncode == 2
    assert "--threads must be at least 1, got 0" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, line", [
    (("--network", "nope"), "argument --network: invalid choice: 'nope' (choose from 'r18'"),
    (("--network", "mbf_small", "--image-size", "50"), "--image-size must be a multiple of 16 (every backbone"),
])
def test_an_unknown_network_or_image_size_is_one_line(args, line):
    result = run_profile(*args)
    assert result.returncode == 2 and line in result.stderr and "Traceback" not in result.stderr


def test_a_directory_that_is_not_arcface_torch_is_one_line(tmp_path):
    result = run_profile("--network", "mbf", "--arcface-torch", str(tmp_path))
    assert result.returncode == 2
    assert f"--arcface-torch {tmp_path} is not arcface_torch: no backbones/__init__.py" in result.stderr
    assert "Traceback" not in result.stderr


def test_mxnet_runs_the_threads_asked_for_or_the_profile_says_why():
    """A profile at 1 thread whose MXNet ran 2 (an OpenMP runtime loaded before the thread count
    was set: importing torch first did so) would halve sample_fc's side; op_profile sets the
    count before importing anything and refuses, in one line, a runtime already running others."""
    preloaded = ("import ctypes, os; os.environ.pop('OMP_NUM_THREADS', None); "
                 "threads = ctypes.CDLL('libgomp.so.1').omp_get_max_threads(); "
                 "from bench.op_profile import main; main({args})")
    args = ["--network", "mbf_small", "--image-size", "32", "--batch", "4", "--steps", "1", "--top", "1"]
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    if os.cpu_count() < 2:
        pytest.skip("one core: the runtime's default is the thread asked for")
    refused = subprocess.run([sys.executable, "-c", preloaded.format(args=args + ["--threads", "1"])], cwd=REPO,
                             capture_output=True, text=True, timeout=600, env=env)
    assert refused.returncode != 0
    assert f"error: MXNet's OpenMP runs {os.cpu_count()} threads, not --threads 1" in refused.stderr
    assert "Traceback" not in refused.stderr
    for threads in ("1", "2"):
        result = run_profile(*args, "--threads", threads)
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"{threads} thread(s)" in result.stdout
