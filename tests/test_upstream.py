"""bench/yardstick/upstream.py: arcface_torch's files imported at run time (a stand-in checkout here).
torch cannot be imported after horovod.mxnet, which this test process may have imported (sample_fc.dist
bars it): the check runs in a process of its own (torch is a test requirement: scripts/test.sh)."""
import subprocess
import sys

from conftest import REPO

BACKBONES_INIT = '''from .iresnet import iresnet18


def get_model(name, **kwargs):
    return iresnet18(**kwargs)
'''
IRESNET = '''import torch

class IResNet(torch.nn.Module):
    fc_scale = 7 * 7

def iresnet18(**kwargs):
    return IResNet()
'''
LOAD_TWICE = '''import sys
from bench.yardstick import upstream
first = upstream.load(sys.argv[1])
second = upstream.load(sys.argv[1])
assert first.backbones is not second.backbones
assert second.backbones.iresnet.IResNet.fc_scale == 49
assert isinstance(upstream.build_network(second, "r18", 112), second.backbones.iresnet.IResNet)
print("loaded twice")
'''


def stand_in_checkout(root):
    """The four files load() reads and one backbone module, shaped as arcface_torch's."""
    (root / "backbones").mkdir()
    (root / "backbones" / "__init__.py").write_text(BACKBONES_INIT)
    (root / "backbones" / "iresnet.py").write_text(IRESNET)
    for name in ("partial_fc_v2.py", "losses.py", "lr_scheduler.py"):
        (root / name).write_text("")
    return root


def test_a_second_load_in_one_process_still_sees_the_backbones_submodules(tmp_path):
    """compare trains arcface_torch as shipped, then tuned, each loading the modules: the second
    package must hold `iresnet` too (it did not: AttributeError in build_network)."""
    result = subprocess.run([sys.executable, "-c", LOAD_TWICE, str(stand_in_checkout(tmp_path))], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "loaded twice" in result.stdout
