"""The parts of a training run, built from a resolved config (train.py's recipe).

Every function takes the config (default.py's keys) and explicit rank/context arguments;
nothing here reads default.py or the command line.
"""
import logging
import os
import sys

import mxnet as mx

import symbols

from .data import FaceRecordIter, SyntheticIter
from .data.bin_format import load_bin
from .margin import CombinedMargin
from .memory_bank import MemoryBank
from .module import SampleDistributeModule
from .optimizers import DistributedOptimizer, MemoryBankSGDOptimizer, WarmupMultiStepSchedule
from .sampler import ClassCenterSampler


def resolve_contexts(cfg, local_rank):
    """(backbone context, bank context) for this rank; explicit, never implicit gpu(0)."""
    gpus = mx.context.num_gpus()
    kind = ("gpu" if gpus else "cpu") if cfg.context == "auto" else cfg.context
    if kind == "gpu" and local_rank >= gpus:
        raise RuntimeError(f"context=gpu but local rank {local_rank} has no GPU (this node has {gpus})")
    ctx = mx.gpu(local_rank) if kind == "gpu" else mx.cpu()
    return ctx, (ctx if cfg.bank_context == "same" else mx.cpu())


def build_iterator(cfg, rank, world):
    """This rank's training iterator: the RecordIO shard, or random data when cfg.synthetic."""
    shape = (3, cfg.image_size, cfg.image_size)
    if cfg.synthetic:
        return SyntheticIter(cfg.batch_size, cfg.num_classes, shape, seed=cfg.seed, rank=rank)
    return FaceRecordIter(cfg.rec, cfg.batch_size, shape, rank=rank, num_workers=world, seed=cfg.seed,
                          num_threads=cfg.data_threads, num_classes=cfg.num_classes)


def build_symbol(cfg):
    return symbols.get_symbol(cfg.network, cfg.embedding_size, cfg.image_size,
                              "float16" if cfg.fp16 else "float32", cfg.dropout)


def build_module(cfg, symbol, rank, world, ctx, bank_ctx, logger):
    """The SampleDistributeModule of this rank, parameters initialised and equal on all ranks.

    The lr is given for a global batch of 512 and scaled by the real one (lr_scale_by_world);
    backbone and bank share one schedule, a pure function of the update number.
    """
    lr = cfg.lr * (cfg.batch_size * world / 512 if cfg.lr_scale_by_world else 1.0)
    schedule = WarmupMultiStepSchedule(lr, cfg.warmup_steps, cfg.lr_steps, cfg.lr_factor)
    backbone_optimizer = DistributedOptimizer(mx.optimizer.SGD(
        learning_rate=lr, momentum=cfg.momentum, wd=cfg.wd, rescale_grad=1.0, lr_scheduler=schedule,
        multi_precision=cfg.fp16))
    bank = MemoryBank.for_rank(cfg.num_classes, rank, world, cfg.embedding_size, bank_ctx, seed=cfg.seed)
    module = SampleDistributeModule(
        symbol, bank=bank, sampler=ClassCenterSampler.for_bank(bank, cfg.sample_ratio, seed=cfg.seed),
        margin=CombinedMargin(cfg.loss_m1, cfg.loss_m2, cfg.loss_m3, cfg.loss_s),
        bank_optimizer=MemoryBankSGDOptimizer(schedule, cfg.momentum, cfg.wd),
        backbone_optimizer=backbone_optimizer, context=ctx, batch_size=cfg.batch_size,
        data_shape=(3, cfg.image_size, cfg.image_size), allgather=cfg.allgather,
        head_kernel=cfg.head_kernel, max_nonfinite_steps=cfg.max_nonfinite_steps, logger=logger)
    module.init_params()
    module.broadcast_parameters()
    return module


def load_targets(cfg, logger):
    """{name: (images, issame)} of the val_targets found next to the training data."""
    folder = os.path.dirname(os.path.abspath(cfg.rec)) if cfg.rec else ""
    targets = {}
    for name in cfg.val_targets:
        path = os.path.join(folder, name + ".bin")
        if os.path.isfile(path):
            targets[name] = load_bin(path, cfg.image_size)
        else:
            logger.warning("verification target %s not found at %s; skipped", name, path)
    return targets


def setup_logger(rank, models_root):
    """The run's logger: rank 0 logs INFO to stdout and models_root/train.log, others WARNING."""
    logger = logging.getLogger("sample_fc")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.handlers.clear()
    logger.propagate = False
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stdout)]
    if rank == 0:
        handlers.append(logging.FileHandler(os.path.join(models_root, "train.log")))
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger


def tensorboard_writer(cfg, rank, models_root):
    """A tensorboardX SummaryWriter on rank 0 when cfg.tensorboard, else None."""
    if not (cfg.tensorboard and rank == 0):
        return None
    from tensorboardX import SummaryWriter
    return SummaryWriter(os.path.join(models_root, "tensorboard"))
