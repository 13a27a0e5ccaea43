"""bench/op_profile.py: a backbone step's time by operator, as MXNet's profiler counts it."""
import re
import subprocess
import sys

from conftest import REPO


def run_profile(*args):
    return subprocess.run([sys.executable, "-m", "sample_fc.bench.op_profile", *args], cwd=REPO,
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


def test_a_directory_that_is_not_arcface_torch_is_one_line(tmp_path):
    result = run_profile("--network", "mbf", "--arcface-torch", str(tmp_path))
    assert result.returncode == 2
    assert f"--arcface-torch {tmp_path} is not arcface_torch: no backbones/__init__.py" in result.stderr
    assert "Traceback" not in result.stderr
