"""A faithful yardstick: insightface arcface_torch's training step as train_v2.py runs it, in PyTorch.

    .venv/bin/python -m bench.yardstick [--check-against /tmp/arcface_torch]
        [--rec DIR] [--source memory|rec] [--network mbf|r50|...] [--image-size 32]
        [--classes 1000] [--batch 128] [--steps 2] [--rounds 12] [--sample-rate 1.0]
        [--margins 1,0,0.25] [--scale 64] [--lr 0.1] [--weight-decay 5e-4] [--ddp] [--threads N]

What it measures: samples/s of one process training as arcface_torch does on CPU (its
MobileFaceNet or IResNet, PartialFC_V2 with CombinedMarginLoss, SGD with its weight decay,
gradient clipping at 5, its lr schedule), fed either from images decoded once and held in
memory or from the .rec decoded per step by DataLoader workers as its dataset.py does. With
--check-against DIR (a copy of recognition/arcface_torch, imported at run time, never stored
here) it first checks ours against their own modules (same weights -> same embeddings; one
training step from equal states -> same loss and same updated parameters), then times both
steps in alternating rounds on the same threads and data, and prints the ratio (bound: ours
within 5% of theirs, either way) in samples per wall second and per CPU second of the process
(the second moves less when other work shares the cores; loader workers' CPU is not in it).
Threads and processes are printed: both sides run in this one process, with torch's default
threads (importing mxnet, as their dataset.py does at import, drops torch to 1 thread: the
yardstick sets them back). Left out on both sides: train_v2.py's DistributedDataParallel
wrapper (its fp16-compressed gradient all-reduce has nothing to reduce on one process), fp16
autocast (CUDA only) and its logging and verification callbacks.

    networks  their backbones' layouts (mbf, r18..r200), final kernel following the input size
    training  PartialFC_V2, CombinedMarginLoss, SGD set-up, clipping, lr schedule: the step
    data      the .rec read and decoded as their dataset.py does; the in-memory image set
    upstream  their own modules loaded from a directory and made to run on CPU
    faithful  the forward and one-step checks and the alternating timing
    ddp       the step as N processes (DDP, PartialFC_V2 split by class): bench.compare --torch-np N
    tuned     the step as a skilled CPU user runs it (channels-last model and batches): the "tuned" rows
"""
try:
    import torch  # noqa: F401  (every module here needs it)
except ImportError:
    raise SystemExit("bench.yardstick: error: PyTorch is not installed; run `scripts/test.sh -k yardstick` "
                     "once (it installs torch, CPU build, from requirements-test.txt)") from None

from .data import MemoryFaces, RecFaces, rec_loader
from .networks import IResNet, MobileFaceNet, build_network, final_side, parameter_count
from .training import CombinedMargin, PartialFC, Trainer, make_optimizer, sample_centers, scheduled_lr
