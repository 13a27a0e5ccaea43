"""Worker: train.py's main() with one injected fault (tests only).

    faulty_train.py KIND STEP RANK -- <train.py arguments>
KIND: raise | sigkill | hang (at update STEP on rank RANK; hang sleeps outside any collective),
nan (NaN in RANK's batch at update STEP), kill_in_save (SIGKILL on RANK right after it writes
its bank shard for checkpoint STEP), enospc_in_save (RANK's bank shard write for checkpoint STEP
fails with "No space left on device"), small_disk (the models root's file system reports
STEP bytes free on every rank), slow_stop_save (RANK's bank shard write of the checkpoint a
stop asked for by a signal takes STEP seconds more), pauseS (RANK's whole process stopped by
SIGSTOP for S seconds, then SIGCONT from a child it started: at update STEP, or with STEP -1
at start, as its model and bank are built).
"""
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import train  # noqa: E402
from sample_fc import builder, dist  # noqa: E402
from sample_fc.checkpoint import save_restore  # noqa: E402
from sample_fc.module import SampleDistributeModule  # noqa: E402

kind, step, on_rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
train_args = sys.argv[sys.argv.index("--") + 1:]
original_forward, original_save = SampleDistributeModule.forward_backbone, save_restore.write_shard
injected = []
FORWARD_FAULTS = ("raise", "sigkill", "hang", "nan")


def pause(seconds):
    """Stop this whole process for `seconds` (SIGSTOP), woken by a child's SIGCONT."""
    subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    print(f"INJECTING a {seconds:g} s pause (SIGSTOP) on rank {on_rank} (unix time {time.time():.3f})", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


def faulty_forward(self, data_batch):
    if kind.startswith("pause") and dist.rank() == on_rank and self.num_update == step and not injected:
        injected.append(kind)
        pause(float(kind[len("pause"):]))
    if kind in FORWARD_FAULTS and dist.rank() == on_rank and self.num_update == step and not injected:
        injected.append(kind)
        print(f"INJECTING {kind} on rank {on_rank} at update {step} (unix time {time.time():.3f})", flush=True)
        if kind == "raise":
            raise RuntimeError(f"injected fault on rank {on_rank} at update {step}")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            time.sleep(3600)
        if kind == "nan":
            data_batch.data[0][0, 0, 0, 0] = float("nan")
    return original_forward(self, data_batch)


def stop_requested():
    """Whether this process's stop handler (sample_fc.run.stop.StopSignals) has recorded a signal."""
    return bool(getattr(getattr(signal.getsignal(signal.SIGTERM), "__self__", None), "requested", 0))


def faulty_save(bank, files):
    path = files["meta"]
    if kind == "slow_stop_save" and dist.rank() == on_rank and stop_requested():
        print(f"INJECTING a {step} s bank write in the stop's checkpoint on rank {on_rank}", flush=True)
        time.sleep(step)
    if kind == "enospc_in_save" and dist.rank() == on_rank and f"step-{step:08d}.partial" in path:
        print(f"INJECTING ENOSPC in checkpoint save on rank {on_rank}", flush=True)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    original_save(bank, files)
    if kind == "kill_in_save" and dist.rank() == on_rank and f"step-{step:08d}.partial" in path:
        print(f"INJECTING SIGKILL in checkpoint save on rank {on_rank}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


def paused_build_module(*args, **kwargs):
    if kind.startswith("pause") and step == -1 and dist.rank() == on_rank:
        pause(float(kind[len("pause"):]))
    return original_build_module(*args, **kwargs)


original_build_module = builder.build_module
builder.build_module = paused_build_module
SampleDistributeModule.forward_backbone = faulty_forward
save_restore.write_shard = faulty_save
if kind == "small_disk":
    save_restore.free_bytes = lambda path: step
sys.exit(train.main(train_args))
