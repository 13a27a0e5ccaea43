"""Tests of the Horovod layer in one process: importing it does not break JPEG decoding (libjpeg
symbol clash); without a launcher it starts on Gloo."""
import json
import os
import subprocess
import sys

from conftest import REPO


def test_jpeg_decodes_after_importing_dist():
    """Test that Pillow still decodes a JPEG once sample_fc.dist (horovod.mxnet) is imported."""
    code = (
        "import io, numpy as np\n"
        "import sample_fc.dist\n"
        "from PIL import Image\n"
        "pixels = (np.arange(48 * 48 * 3) % 251).astype(np.uint8).reshape(48, 48, 3)\n"
        "buffer = io.BytesIO(); Image.fromarray(pixels).save(buffer, 'JPEG', quality=95)\n"
        "decoded = np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert('RGB'))\n"
        "assert decoded.shape == (48, 48, 3), decoded.shape\n"
        "print('DECODED')\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=str(REPO), timeout=120)
    assert "DECODED" in result.stdout, result.stderr[-2000:]


ALONE = """
import json, os, subprocess
from sample_fc import dist
import horovod.mxnet as hvd
before = dict(os.environ)
dist.init()
children = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "comm="], capture_output=True,
                          text=True).stdout.split()
print(json.dumps({"gloo": hvd.gloo_enabled(), "mpi": hvd.mpi_enabled(), "size": hvd.size(),
                  "children": [c for c in children if c != "ps"], "env_kept": dict(os.environ) == before}))
"""


def test_a_process_started_without_a_launcher_runs_horovod_on_gloo():
    """Test that dist.init in a process no launcher started (python train.py, a test) starts
    Horovod on Gloo as a world of one, even where Horovod has MPI: no MPI singleton and so no
    orted daemon forked from Horovod's thread; and that the environment is left as it was."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID",
                        "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")}
    result = subprocess.run([sys.executable, "-c", ALONE], capture_output=True, text=True, cwd=str(REPO),
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"gloo": True, "mpi": False, "size": 1, "children": [], "env_kept": True}
