"""Tests for sample_fc.run.gpus: reading the node's GPUs without MXNet (a fake nvidia-smi, a fake
libcuda.so.1), which of them MXNet 1.9.1 runs on, the one-line refusal for the others, and the GPU
environment's pinned requirements (this machine has no GPU)."""
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sample_fc.run import gpus
from sample_fc.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
CARDS = [("NVIDIA H100 80GB HBM3", "9.0"), ("NVIDIA B200", "10.0"), ("NVIDIA A100-SXM4-80GB", "8.0"),
         ("NVIDIA L4", "8.9"), ("Tesla K80", "3.7"), ("NVIDIA GeForce RTX 4090", "8.9")]
REFUSED = {0, 1, 4}


class Ctx:
    """What check_gpu_context reads of an mx.Context (mx.gpu(i) itself is the same for it)."""
    def __init__(self, device_type, device_id):
        self.device_type, self.device_id = device_type, device_id


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """An nvidia-smi on PATH answering the name,compute_cap query for `cards`, and no libcuda (the
    driver API reader finds nothing, as on a node whose driver is not loadable)."""
    def install(cards, exit_code=0):
        script = tmp_path / "nvidia-smi"
        answer = "".join(f"echo '{name}, {cap}'\n" for name, cap in cards)
        script.write_text("#!/bin/sh\n"
                          '[ "$*" = "--query-gpu=name,compute_cap --format=csv,noheader" ] || exit 9\n'
                          f"{answer}exit {exit_code}\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setattr(gpus, "LIBCUDA", str(tmp_path / "no-libcuda.so.1"))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return install


def test_mxnet_code_for_follows_cubin_compatibility():
    """Test that a device runs the highest cubin of its own major version whose minor is not above
    its own (6.1 -> 6.0, 7.5 -> 7.0, 8.9 -> 8.6), and that 9.0, 10.0, 12.0 and 3.7 get none."""
    table = {(5, 0): (5, 0), (5, 2): (5, 0), (6, 0): (6, 0), (6, 1): (6, 0), (7, 0): (7, 0), (7, 5): (7, 0),
             (8, 0): (8, 0), (8, 6): (8, 6), (8, 7): (8, 6), (8, 9): (8, 6),
             (9, 0): None, (10, 0): None, (12, 0): None, (3, 7): None, (3, 5): None}
    assert {cap: gpus.mxnet_code_for(cap) for cap in table} == table


def test_fake_nvidia_smi_is_read_and_refused_or_allowed(fake_smi):
    """Test that the GPUs come from nvidia-smi when libcuda cannot be loaded, and that H100 (9.0),
    B200 (10.0) and K80 (3.7) stop a GPU run with the exact line while A100 (8.0), L4 (8.9) and
    RTX 4090 (8.9) pass."""
    fake_smi(CARDS)
    listed = gpus.visible_gpus()
    assert listed == [gpus.Gpu(i, name, tuple(int(x) for x in cap.split("."))) for i, (name, cap) in enumerate(CARDS)]
    for index, (name, cap) in enumerate(CARDS):
        if index in REFUSED:
            with pytest.raises(UsageError) as raised:
                gpus.check_gpu_context(Ctx("gpu", index))
            line = str(raised.value)
            assert line.startswith(f"--context gpu:{index}: GPU {index} is {name}, compute capability {cap}, "
                                   "which MXNet 1.9.1 cannot run: ") and "\n" not in line
            assert "train on the CPU (--context cpu)" in line and "8.9 runs 8.6" in line
        else:
            gpus.check_gpu_context(Ctx("gpu", index))
    gpus.check_gpu_context(Ctx("cpu", 0))     # a CPU context never reads or refuses


def test_the_h100_line_word_for_word(fake_smi):
    """Test the refusal of an H100 as a user reads it: the GPU, its capability, what MXNet 1.9.1's
    builds carry, and the two ways out."""
    fake_smi(CARDS[:1])
    with pytest.raises(UsageError) as raised:
        gpus.check_gpu_context(Ctx("gpu", 0), setting="context=gpu", cpu_choice="context=cpu")
    assert str(raised.value) == (
        "context=gpu: GPU 0 is NVIDIA H100 80GB HBM3, compute capability 9.0, which MXNet 1.9.1 cannot "
        "run: its CUDA builds carry code for 5.0, 6.0, 7.0, 8.0 and 8.6 only, no PTX (6.1 runs 6.0 "
        "code, 7.5 runs 7.0, 8.9 runs 8.6; nothing runs on 9.0 and later or below 5.0); train on the "
        "CPU (context=cpu), or use an MXNet built from source with CUDA >= 11.8 and 9.0 in "
        "MXNET_CUDA_ARCH (README: GPUs)")
    assert "CUDA >= 12.8 and 10.0" in gpus.refusal(gpus.Gpu(0, "NVIDIA B200", (10, 0)), "x")
    assert "(11.x for 3.5 and 3.7) and 3.7" in gpus.refusal(gpus.Gpu(0, "Tesla K80", (3, 7)), "x")


def test_cuda_visible_devices_and_unreadable_answers(fake_smi, monkeypatch):
    """Test that nvidia-smi's list follows CUDA_VISIBLE_DEVICES as CUDA numbers GPUs, and that an
    old driver's answer (no compute_cap field: non-zero exit) or a garbled one reads as unknown
    (None), which refuses nothing."""
    fake_smi(CARDS[:3])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert [(g.index, g.name) for g in gpus.visible_gpus()] == [(0, CARDS[2][0]), (1, CARDS[0][0])]
    gpus.check_gpu_context(Ctx("gpu", 0))                  # the A100
    with pytest.raises(UsageError, match="GPU 1 is NVIDIA H100"):
        gpus.check_gpu_context(Ctx("gpu", 1))
    fake_smi(CARDS[:1], exit_code=6)
    assert gpus.visible_gpus() is None
    gpus.check_gpu_context(Ctx("gpu", 0))
    fake_smi([("NVIDIA H100 80GB HBM3", "[N/A]")])
    assert gpus.from_nvidia_smi() is None


def test_no_driver_at_all(tmp_path, monkeypatch):
    """Test that with neither libcuda nor nvidia-smi the GPUs are unknown (None)."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpus, "LIBCUDA", str(tmp_path / "no-libcuda.so.1"))
    assert gpus.visible_gpus() is None


FAKE_LIBCUDA = r"""
#include <string.h>
static const char *names[] = {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"};
static const int caps[][2] = {{9, 0}, {8, 0}};
int cuInit(unsigned flags) { return flags == 0 ? INIT_STATUS : 1; }
int cuDeviceGetCount(int *count) { *count = 2; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal + 10; return 0; }
int cuDeviceGetName(char *name, int len, int device) { strncpy(name, names[device - 10], len); return 0; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
    if (attribute != 75 && attribute != 76) return 1;
    *value = caps[device - 10][attribute - 75]; return 0; }
"""


@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler for the fake libcuda")
def test_driver_api_through_ctypes(tmp_path, monkeypatch):
    """Test the driver API reader against a fake libcuda.so.1 (cuInit, cuDeviceGetCount,
    cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute 75/76), which it prefers to nvidia-smi;
    cuInit's CUDA_ERROR_NO_DEVICE (100) means no GPU, another error means unknown."""
    source = tmp_path / "fake_cuda.c"
    source.write_text(FAKE_LIBCUDA)
    libraries = {}
    for status in (0, 100, 999):
        libraries[status] = tmp_path / f"libcuda-{status}.so.1"
        subprocess.run(["cc", "-shared", "-fPIC", f"-DINIT_STATUS={status}", "-o", str(libraries[status]), str(source)],
                       check=True)
    monkeypatch.setenv("PATH", str(tmp_path))                  # no nvidia-smi: only the driver API answers
    monkeypatch.setattr(gpus, "LIBCUDA", str(libraries[0]))
    assert gpus.visible_gpus() == [gpus.Gpu(0, "NVIDIA H100 80GB HBM3", (9, 0)), gpus.Gpu(1, "NVIDIA A100-SXM4-80GB", (8, 0))]
    with pytest.raises(UsageError, match=r"^--context gpu:0: GPU 0 is NVIDIA H100 80GB HBM3, compute capability 9\.0"):
        gpus.check_gpu_context(Ctx("gpu", 0))
    gpus.check_gpu_context(Ctx("gpu", 1))
    assert gpus.from_driver_api(str(libraries[100])) == []
    assert gpus.from_driver_api(str(libraries[999])) is None


def test_a_tool_refuses_an_h100_before_any_work(fake_smi, tmp_path):
    """Test that a tool given --context gpu:0 on an H100 node exits 2 with the refusal as its error
    line (argparse's, as --context is checked while the options are parsed) and no traceback."""
    fake_smi(CARDS[:1])
    (tmp_path / "pairs.bin").write_bytes(b"")               # verify checks --bin exists first
    code = (f"import sys, sample_fc.run.gpus as g; g.LIBCUDA = {gpus.LIBCUDA!r}; "
            "from sample_fc.tools import verify; "
            f"verify.main(['--model', {str(tmp_path / 'absent')!r}, '--bin', {str(tmp_path / 'pairs.bin')!r}, '--context', 'gpu:0'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True, text=True,
                            timeout=300, env=dict(os.environ))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("python -m sample_fc.tools.verify: error: ") and error.endswith(" (README: GPUs)")
    assert "--context gpu:0: GPU 0 is NVIDIA H100 80GB HBM3, compute capability 9.0, which MXNet 1.9.1 cannot run" in error


def _pins(path):
    pins = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            requirement, _, marker = line.partition(";")
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", requirement.strip()).groups()
            pins[(name.lower(), marker.strip())] = version
    return pins


def test_gpu_requirements_match_the_cpu_ones():
    """Test that requirements-gpu.txt pins every package of requirements.txt but mxnet at the same
    version (and marker), mxnet-cu117 1.9.1 as mxnet's CUDA twin, cuDNN 8.5.0.96, and only
    nvidia-*-cu11 wheels besides."""
    cpu, gpu = _pins(REPO / "requirements.txt"), _pins(REPO / "requirements-gpu.txt")
    shared = {key: version for key, version in cpu.items() if key[0] != "mxnet"}
    assert {key: gpu.get(key) for key in shared} == shared
    assert gpu[("mxnet-cu117", "")] == cpu[("mxnet", "")] == "1.9.1"
    assert gpu[("nvidia-cudnn-cu11", "")] == "8.5.0.96"
    extra = set(gpu) - set(shared) - {("mxnet-cu117", "")}
    assert extra and all(re.fullmatch(r"nvidia-[a-z\-]+-cu11", name) for name, _ in extra), extra


def test_fatbin_reader_on_a_made_up_section(tmp_path):
    """Test scripts/fatbin_archs.py's parser on a .nv_fatbin section built here: two fat binaries
    (cubins sm_80 + sm_86, and a cubin sm_70 + PTX compute_70) with padding between them."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import fatbin_archs
    finally:
        sys.path.pop(0)

    def entry(kind, arch, payload):
        header = struct.pack("<HHIQIIHH", kind, 0x101, 64, len(payload), len(payload), 0, 0, 0)
        header += struct.pack("<I", arch) + bytes(64 - 32)          # the architecture at byte 28
        return header + payload

    def fatbin(entries):
        body = b"".join(entries)
        return struct.pack("<IHHQ", gpus_magic, 1, 16, len(body)) + body

    gpus_magic = fatbin_archs.FATBIN_MAGIC
    section = (fatbin([entry(2, 80, b"x" * 40), entry(2, 86, b"y" * 24)]) + bytes(8)
               + fatbin([entry(2, 70, b"z" * 8), entry(1, 70, b"ptx\0")]))
    binaries = fatbin_archs.fatbin_entries(section)
    assert binaries == [[("cubin", 80), ("cubin", 86)], [("cubin", 70), ("ptx", 70)]]
    assert fatbin_archs.summary(binaries[:1]) == "1 fat binaries; cubin sm_80 in 1, cubin sm_86 in 1; no PTX"
    assert fatbin_archs.nv_fatbin_section(sys.executable) == b""   # an ELF without GPU code
