"""Worker: train.py's main() with planned faults, each fired once across restarts (tests only).

    SAMPLE_FC_FAULTS="sigkill:13:1,kill_in_save:30:0,hang_all:45" SAMPLE_FC_FAULT_DIR=DIR \
        soak_train.py <train.py arguments>
sigkill:STEP:RANK   SIGKILL rank RANK at update STEP
kill_in_save:STEP:RANK   SIGKILL rank RANK right after it writes its bank shard of checkpoint STEP
hang_all:STEP   every rank sleeps at update STEP, outside any collective (the step watchdog ends it)
value_error:STEP:RANK   rank RANK raises a ValueError at update STEP (a bug, not a usage mistake)
A fault fires once: a marker file in DIR (per rank for hang_all) remembers it across restarts.
"""
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import train  # noqa: E402
from sample_fc import dist  # noqa: E402
from sample_fc.checkpoint import save_restore  # noqa: E402
from sample_fc.module import SampleDistributeModule  # noqa: E402

PLAN = [fault.split(":") for fault in os.environ["SAMPLE_FC_FAULTS"].split(",")]
MARKERS = Path(os.environ["SAMPLE_FC_FAULT_DIR"])
original_forward, original_save = SampleDistributeModule.forward_backbone, save_restore.write_shard


def fire_once(name):
    """True the first time any process asks for `name` (an exclusive-create marker file)."""
    try:
        with open(MARKERS / name, "x"):
            return True
    except FileExistsError:
        return False


def faulty_forward(self, data_batch):
    rank, step = dist.rank(), self.num_update
    for kind, at, *on_rank in PLAN:
        if int(at) != step:
            continue
        if kind == "sigkill" and rank == int(on_rank[0]) and fire_once(f"sigkill-{at}"):
            print(f"INJECTING sigkill on rank {rank} at update {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "value_error" and rank == int(on_rank[0]) and fire_once(f"value_error-{at}"):
            print(f"INJECTING value_error on rank {rank} at update {step}", flush=True)
            raise ValueError(f"injected bug on rank {rank} at update {step}")
        if kind == "hang_all" and fire_once(f"hang_all-{at}-rank{rank}"):
            print(f"INJECTING hang on rank {rank} at update {step}", flush=True)
            time.sleep(3600)
    return original_forward(self, data_batch)


def faulty_save(bank, files):
    path = files["meta"]
    original_save(bank, files)
    for kind, at, *on_rank in PLAN:
        if (kind == "kill_in_save" and dist.rank() == int(on_rank[0]) and f"step-{int(at):08d}.partial" in path
                and fire_once(f"kill_in_save-{at}")):
            print(f"INJECTING sigkill in checkpoint save on rank {dist.rank()}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


SampleDistributeModule.forward_backbone = faulty_forward
save_restore.write_shard = faulty_save
sys.exit(train.main(sys.argv[1:]))
