"""The GPUs of this node as the NVIDIA driver sees them, and whether MXNet 1.9.1 can run on them.

`visible_gpus` is the one place that reads them, without MXNet: the CUDA driver API through ctypes
(libcuda.so.1: cuInit, cuDeviceGetCount, cuDeviceGetName, cuDeviceGetAttribute 75/76; it honours
CUDA_VISIBLE_DEVICES), else `nvidia-smi --query-gpu=name,compute_cap` (CUDA_VISIBLE_DEVICES applied
when it lists indices). MXNet 1.9.1's CUDA wheels (mxnet-cu112, mxnet-cu117, the last) carry cubins
for compute capabilities 5.0, 6.0, 7.0, 8.0 and 8.6 and no PTX (scripts/fatbin_archs.py reads
them); a device runs a cubin of its own major version and a minor not above its own, so 8.9 runs
8.6 code and nothing runs on 9.0 (Hopper) and later, or below 5.0. `check_gpu_context` turns that
into one line before anything is placed on such a GPU.
"""
import ctypes
import os
import re
import shutil
import subprocess
from typing import NamedTuple, Optional, Tuple

from ..errors import UsageError

LIBCUDA = "libcuda.so.1"
NVIDIA_SMI_QUERY = ("nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader")
MXNET_CUBINS = ((5, 0), (6, 0), (7, 0), (8, 0), (8, 6))      # mxnet-cu117 1.9.1's libmxnet.so, no PTX
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76
_CUDA_SUCCESS, _CUDA_ERROR_NO_DEVICE = 0, 100


class Gpu(NamedTuple):
    """One visible GPU: its index as CUDA numbers it (gpu(index)), name, compute capability."""
    index: int
    name: str
    capability: Tuple[int, int]

    @property
    def capability_text(self):
        return "%d.%d" % self.capability


def from_driver_api(library=None):
    """[Gpu] from the CUDA driver API; [] when the driver finds no device; None when libcuda
    cannot be loaded or a call fails (then nvidia-smi is asked)."""
    try:
        cuda = ctypes.CDLL(library or LIBCUDA)
    except OSError:
        return None
    status = cuda.cuInit(0)
    if status == _CUDA_ERROR_NO_DEVICE:
        return []
    count = ctypes.c_int()
    if status != _CUDA_SUCCESS or cuda.cuDeviceGetCount(ctypes.byref(count)) != _CUDA_SUCCESS:
        return None
    gpus = []
    for index in range(count.value):
        device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        name = ctypes.create_string_buffer(256)
        if (cuda.cuDeviceGet(ctypes.byref(device), index)
                or cuda.cuDeviceGetName(name, len(name), device)
                or cuda.cuDeviceGetAttribute(ctypes.byref(major), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                             device)
                or cuda.cuDeviceGetAttribute(ctypes.byref(minor), _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                             device)):
            return None
        gpus.append(Gpu(index, name.value.decode("utf-8", "replace"), (major.value, minor.value)))
    return gpus


def from_nvidia_smi():
    """[Gpu] from `nvidia-smi --query-gpu=name,compute_cap` (drivers >= 510 know compute_cap), in
    the order CUDA_VISIBLE_DEVICES gives when it lists indices; None when there is no nvidia-smi or
    its answer cannot be read."""
    if not shutil.which(NVIDIA_SMI_QUERY[0]):
        return None
    try:
        answer = subprocess.run(NVIDIA_SMI_QUERY, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if answer.returncode != 0:
        return None
    listed = []
    for line in answer.stdout.splitlines():
        match = re.fullmatch(r"\s*(.+?)\s*,\s*(\d+)\.(\d+)\s*", line)
        if not line.strip():
            continue
        if not match:
            return None
        listed.append((match.group(1), (int(match.group(2)), int(match.group(3)))))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and re.fullmatch(r"\s*(\d+\s*(,\s*\d+\s*)*)?", visible):
        order = [int(i) for i in visible.split(",") if i.strip()]
        listed = [listed[i] for i in order if i < len(listed)]
    return [Gpu(index, name, capability) for index, (name, capability) in enumerate(listed)]


def visible_gpus(readers=(from_driver_api, from_nvidia_smi)):
    """The GPUs CUDA would number 0, 1, ...: the first reader's answer that is not None; None
    when none can tell (no NVIDIA driver on this node)."""
    for read in readers:
        gpus = read()
        if gpus is not None:
            return gpus
    return None


def mxnet_code_for(capability) -> Optional[Tuple[int, int]]:
    """The architecture of MXNet 1.9.1's cubins that a device of `capability` runs, or None: the
    highest one of the same major version whose minor is not above the device's (no PTX)."""
    fitting = [arch for arch in MXNET_CUBINS if arch[0] == capability[0] and arch[1] <= capability[1]]
    return max(fitting) if fitting else None


def _source_build(gpu):
    """The MXNet build from source that could target `gpu`."""
    cuda = "12.8" if gpu.capability >= (10, 0) else "11.8" if gpu.capability >= (9, 0) else None
    if cuda is None:
        return (f"an MXNet built from source with a CUDA that still targets {gpu.capability_text} "
                f"(11.x for 3.5 and 3.7) and {gpu.capability_text} in MXNET_CUDA_ARCH")
    return f"an MXNet built from source with CUDA >= {cuda} and {gpu.capability_text} in MXNET_CUDA_ARCH"


def refusal(gpu, cpu_choice):
    """The line that stops a run on `gpu`, or None when MXNet 1.9.1 runs on it."""
    if mxnet_code_for(gpu.capability) is not None:
        return None
    return (f"GPU {gpu.index} is {gpu.name}, compute capability {gpu.capability_text}, which MXNet "
            "1.9.1 cannot run: its CUDA builds carry code for 5.0, 6.0, 7.0, 8.0 and 8.6 only, no PTX "
            "(6.1 runs 6.0 code, 7.5 runs 7.0, 8.9 runs 8.6; nothing runs on 9.0 and later or below "
            f"5.0); train on the CPU ({cpu_choice}), or use {_source_build(gpu)} (README: GPUs)")


def check_gpu_context(ctx, gpus=None, setting=None, cpu_choice="--context cpu"):
    """UsageError when `ctx` (anything with device_type and device_id, e.g. mx.gpu(1)) is a GPU
    of this node that MXNet 1.9.1 cannot run on; `gpus` as visible_gpus() gives them (read when
    not given); nothing when the GPU cannot be read or `ctx` is a CPU."""
    if ctx.device_type != "gpu":
        return
    gpus = visible_gpus() if gpus is None else gpus
    for gpu in gpus or ():
        line = refusal(gpu, cpu_choice) if gpu.index == ctx.device_id else None
        if line:
            raise UsageError(f"{setting or f'--context gpu:{ctx.device_id}'}: {line}")


def describe(gpus):
    """'8 GPU(s) (NVIDIA A100-SXM4-80GB 8.0 x8)': how many, and each kind once."""
    kinds = {}
    for gpu in gpus:
        kinds[(gpu.name, gpu.capability_text)] = kinds.get((gpu.name, gpu.capability_text), 0) + 1
    return (f"{len(gpus)} GPU(s) ("
            + ", ".join(f"{name} {capability}" + (f" x{n}" if n > 1 else "")
                        for (name, capability), n in kinds.items()) + ")")


def cpu_build_note(gpus, cpu_choice="context=cpu"):
    """What a node's GPUs mean for a run of MXNet's CPU build: the command that installs the CUDA
    build when MXNet 1.9.1 can run on them, else the line that says it cannot."""
    unrunnable = [line for line in (refusal(gpu, cpu_choice) for gpu in gpus or ()) if line]
    if unrunnable:
        return unrunnable[0]
    return ("this MXNet build is CPU-only: scripts/bootstrap.sh --gpu installs its CUDA build "
            "and ./horovodrun.sh --gpu trains with it (README: GPUs)")
