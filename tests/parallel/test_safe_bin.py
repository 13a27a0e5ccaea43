"""Test that training start-up on 2 Gloo workers never runs code from a verification .bin."""
import os
import pickle

from conftest import per_rank_tail, run_train
from sample_fc.tools.demo_data import make_demo

SYSTEM = f"{os.system.__module__}.system"          # posix.system (nt.system on Windows)


class Shell:
    """Pickles as os.system(command): what a crafted .bin uses to run a command on load."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_training_refuses_malicious_val_bin(tmp_path):
    """Test that train.py with a demo_val.bin that would run a command (loaded at start-up as a
    val_target next to the .rec) exits non-zero naming the file and os.system, and nothing ran."""
    data = tmp_path / "data"
    make_demo(str(data), seed=1, num_identities=16, images_per_identity=2, num_val_identities=2,
              num_pairs=10, image_size=32, progress=False)
    marker = tmp_path / "pwned"
    evil = data / "demo_val.bin"
    evil.write_bytes(pickle.dumps(Shell(f"touch {marker}"), protocol=4))
    result = run_train(tmp_path / "run", data / "train.rec", "--set", "num_classes=16",
                       "--set", "max_update=4", timeout_s=120)
    assert result.returncode != 0, per_rank_tail(result.output)
    assert f"{evil}: not a verification .bin: refused to call {SYSTEM}" in result.output, \
        per_rank_tail(result.output)
    assert not marker.exists()
