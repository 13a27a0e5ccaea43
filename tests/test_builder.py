"""Tests for sample_fc.builder's choice of devices: what runs where is said, never silent."""
import os
import stat

import mxnet as mx
import pytest

from default import get_config
from sample_fc.run import gpus
from sample_fc.builder import resolve_contexts
from sample_fc.errors import UsageError


@pytest.fixture
def fake_driver(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that lists `count` GPUs named `card` of compute capability `cap` (this
    machine has no GPU and a CPU MXNet), and no loadable libcuda (sample_fc.run.gpus asks it first)."""
    def install(count, card="Tesla V100-SXM2-32GB", cap="7.0"):
        script = tmp_path / "nvidia-smi"
        script.write_text("#!/bin/sh\n" + "".join(f"echo '{card}, {cap}'\n" for i in range(count)))
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setattr(gpus, "LIBCUDA", str(tmp_path / "no-libcuda.so.1"))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def test_a_cpu_run_without_gpus_is_quiet(monkeypatch):
    """Test that with no driver and no GPU the run is on the CPU without a warning."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(gpus, "LIBCUDA", "/nonexistent/libcuda.so.1")
    warnings = []
    assert resolve_contexts(get_config(), 0, warnings.append) == (mx.cpu(), mx.cpu())
    assert warnings == []


def test_gpus_mxnet_cannot_see_are_named_once(fake_driver):
    """Test that when the driver lists GPUs but this MXNet sees none, context=auto trains on the
    CPU with one warning saying so, context=gpu is refused naming both counts, and context=cpu
    says nothing."""
    fake_driver(2)
    cfg, warnings = get_config(), []
    assert resolve_contexts(cfg, 0, warnings.append)[0] == mx.cpu()
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0] == ("this node has 2 GPU(s) (Tesla V100-SXM2-32GB 7.0 x2) but MXNet sees none: training on "
                           "the CPU; this MXNet build is CPU-only: scripts/bootstrap.sh --gpu installs its CUDA "
                           "build and ./horovodrun.sh --gpu trains with it (README: GPUs)")
    cfg.context = "gpu"
    with pytest.raises(UsageError, match=r"MXNet sees 0 on this node, the driver 2 GPU\(s\) \(Tesla V100-SXM2-32GB "
                                         r"7\.0 x2\): this MXNet build is CPU-only: scripts/bootstrap.sh --gpu"):
        resolve_contexts(cfg, 0)
    cfg.context, warnings = "cpu", []
    resolve_contexts(cfg, 0, warnings.append)
    assert warnings == []


def test_a_gpu_mxnet_cannot_run_is_named_in_one_line(fake_driver):
    """Test that on a node of H100s (9.0) context=gpu stops with the line naming the GPU, its
    capability and the ways out (not 'bootstrap --gpu': no MXNet 1.9.1 build runs there), that
    context=auto trains on the CPU with a warning saying the same, and that on an L4 (8.9, runs
    8.6 code) the CPU build's notice points to the CUDA build instead."""
    fake_driver(8, "NVIDIA H100 80GB HBM3", "9.0")
    cfg, warnings = get_config(), []
    cfg.context = "gpu"
    with pytest.raises(UsageError) as raised:
        resolve_contexts(cfg, 0)
    assert str(raised.value).startswith("context=gpu: GPU 0 is NVIDIA H100 80GB HBM3, compute capability 9.0, "
                                        "which MXNet 1.9.1 cannot run: ")
    assert "train on the CPU (context=cpu)" in str(raised.value) and "bootstrap" not in str(raised.value)
    cfg.context = "auto"
    assert resolve_contexts(cfg, 0, warnings.append)[0] == mx.cpu()
    assert len(warnings) == 1 and warnings[0].startswith(
        "this node has 8 GPU(s) (NVIDIA H100 80GB HBM3 9.0 x8) but MXNet sees none: training on the CPU; "
        "GPU 0 is NVIDIA H100 80GB HBM3, compute capability 9.0, which MXNet 1.9.1 cannot run")
    fake_driver(1, "NVIDIA L4", "8.9")
    cfg.context = "gpu"
    with pytest.raises(UsageError, match=r"the driver 1 GPU\(s\) \(NVIDIA L4 8\.9\): this MXNet build is CPU-only: "
                                         r"scripts/bootstrap.sh --gpu"):
        resolve_contexts(cfg, 0)


def test_fp16_on_a_cpu_run_is_one_line():
    """Test that fp16=true on a CPU run is a UsageError at start-up naming the setting and the
    way out, instead of MXNet's 'FP16 gemm on cpu not implemented' at the first step."""
    cfg = get_config()
    cfg.fp16 = True
    with pytest.raises(UsageError) as error:
        resolve_contexts(cfg, 0)
    message = str(error.value)
    assert message.startswith("fp16=true needs GPUs") and "set fp16=false" in message and "\n" not in message



def test_tensorboard_writer_works_after_horovod_and_torch_is_not_imported(tmp_path):
    """Test that after sample_fc.dist (which imports horovod.mxnet) the TensorBoard writer
    is made and written to in an environment where torch is installed (the test environment
    installs it), without importing torch: tensorboardX would, and torch imported after
    Horovod crashes the process. A later `import torch` is an ImportError, not a crash."""
    import importlib.metadata
    import subprocess
    import sys
    assert importlib.metadata.version("torch"), "the test environment installs torch"
    code = ("import sys\nimport sample_fc.dist\nfrom sample_fc.run.scalar_log import tensorboard_writer\n"
            "from easydict import EasyDict\n"
            f"writer = tensorboard_writer(EasyDict(tensorboard=True), 0, {str(tmp_path)!r})\n"
            "writer.add_scalar('loss', 1.5, 1)\nwriter.close()\n"
            "try:\n    import torch\nexcept ImportError:\n    print('ImportError')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ImportError"
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
