"""The parts of a training run, built from a resolved config (train.py's recipe).

Every function takes the config (sample_fc.config's keys) and explicit rank/context arguments;
nothing here reads the card (default.py) or the command line.
"""
import logging
import os
import sys

import mxnet as mx

from . import symbols
from .symbols.cost import backbone_cost
from . import checkpoint, dist, fused_ops
from .run import memory_plan, resume, run_root, scalar_log
from .data import FaceRecordIter, SyntheticIter
from .data.augment import Augmentation
from .data.bin_format import load_bin
from .config import check_config, overridden_keys, scaled_lr
from .data.recordio import read_property
from .errors import UsageError
from .run.run_record import RunParts, RunRecord
from .run.gpus import check_gpu_context, cpu_build_note, describe, visible_gpus
from .pfc.global_tail import GlobalTail, split_tail
from .initializers import backbone_initializer, initial_params
from .module import SampleDistributeModule
from .optimizers import make_backbone_optimizer, schedule_of
from .pfc.partial_fc import PartialFC, PartialFCOptions
from .pfc.center_optimizer import center_optimizer
from .pfc.sampler import shard_range
from .pfc.sampling_regime import regime, safe_ratio
from .models.saved_model import load_pretrained


def resolve_contexts(cfg, local_rank, warn=lambda message: None):
    """(backbone context, bank context) for this rank; explicit, never implicit gpu(0).
    The node's GPUs are read once (sample_fc.run.gpus, not through MXNet) unless context=cpu: a GPU
    MXNet 1.9.1 has no code for stops a GPU run in one line; a node whose driver lists GPUs that
    this MXNet does not see gets a warning (`warn`); a setting that needs a GPU on a CPU run is a
    UsageError."""
    gpus = mx.context.num_gpus()
    listed = visible_gpus() if cfg.context != "cpu" else None
    unseen = len(listed or ()) if not gpus else 0
    note = cpu_build_note(listed) if unseen else ""
    kind = ("gpu" if gpus else "cpu") if cfg.context == "auto" else cfg.context
    if kind == "gpu":
        check_gpu_context(mx.gpu(local_rank), listed or [], "context=gpu", "context=cpu")
    if kind == "gpu" and local_rank >= gpus:
        raise UsageError(f"context=gpu but local rank {local_rank} has no GPU (MXNet sees {gpus} on this node"
                         f"{f', the driver {describe(listed)}: {note}' if unseen else ''}); "
                         f"use context=auto or cpu, or fewer workers per node")
    if unseen:
        warn(f"this node has {describe(listed)} but MXNet sees none: training on the CPU; {note}")
    if cfg.fp16 and kind == "cpu":
        raise UsageError("fp16=true needs GPUs (MXNet has no float16 GEMM on the CPU) and this run's "
                         f"backbone is on the CPU{f' ({note})' if unseen else ''}; set fp16=false "
                         "(a float16 class-center bank on the CPU is bank_dtype=float16)")
    ctx = mx.gpu(local_rank) if kind == "gpu" else mx.cpu()
    return ctx, (ctx if cfg.bank_context == "same" else mx.cpu())


def build_iterator(cfg, rank, world):
    """This rank's training iterator: the RecordIO shard (augmented as the aug_* keys say), or
    random data when cfg.synthetic."""
    shape = (3, cfg.image_size, cfg.image_size)
    if cfg.synthetic:
        return SyntheticIter(cfg.batch_size, cfg.num_classes, shape, seed=cfg.seed, rank=rank, num_workers=world)
    augment = Augmentation(downscale=cfg.aug_downscale, blur=cfg.aug_blur,
                           color_jitter=cfg.aug_color_jitter, grayscale=cfg.aug_grayscale)
    return FaceRecordIter(cfg.rec, cfg.batch_size, shape, rank=rank, num_workers=world, seed=cfg.seed,
                          num_threads=cfg.data_threads, num_classes=cfg.num_classes, augment=augment)


def build_symbol(cfg):
    symbol = symbols.get_symbol(cfg.network, cfg.embedding_size, cfg.image_size,
                                "float16" if cfg.fp16 else "float32", cfg.dropout)
    return symbols.with_learned_embedding_scale(symbol) if cfg.embedding_scale == "learned" else symbol


def module_of(run, say=None):
    """build_module for an opened run (run_record.RunRecord): its config, backbone, rank, world,
    contexts and --pretrained weights; a resumed run's bank left for its checkpoint to fill."""
    parts = run.parts
    return build_module(run.cfg, parts.symbol, run.rank, run.world, parts.ctx, parts.bank_ctx, parts.pretrained,
                        initial_centers=not run.resume_from, say=say)


def build_module(cfg, symbol, rank, world, ctx, bank_ctx, pretrained=None, initial_centers=True, say=None):
    """The SampleDistributeModule of this rank, parameters initialised (or `pretrained`
    (arg, aux) weights, with a fresh bank and optimizer) and equal on all ranks. The bank's
    initial centers are drawn with the ranks kept in step (dist.Pace; `say`: rank 0's progress
    lines), or left at zero with `initial_centers` False (a checkpoint fills the bank next).

    The lrs (the backbone's, the bank's bank_lr) are given for a global batch of 512 and scaled
    by the real one (lr_scale_by_world); backbone and bank follow one schedule's shape, a pure
    function of the update number.
    """
    global_batch = cfg.batch_size * world
    lr, bank_lr = scaled_lr(cfg, global_batch), scaled_lr(cfg, global_batch, "bank")
    backbone_optimizer = make_backbone_optimizer(cfg, lr, schedule_of(cfg, lr))
    pace = dist.Pace("the bank's initial centers", shard_range(cfg.num_classes, rank, world)[1], say) \
        if initial_centers else None
    partial_fc = PartialFC.for_rank(cfg.num_classes, rank, world, cfg.embedding_size, bank_ctx,
                                    PartialFCOptions.from_config(cfg), schedule_of(cfg, bank_lr),
                                    initial_centers=initial_centers, progress=pace)
    if pace is not None:
        pace.finish()                # before the next collective: every rank holds all its meetings
    data_shape = (cfg.batch_size, 3, cfg.image_size, cfg.image_size)
    training_symbol = symbols.with_frozen_batchnorm(symbol) if cfg.bn_frozen else symbol
    tail = None
    if cfg.tail_bn == "global":     # the last BatchNorms over the global batch (pfc/global_tail.py)
        training_symbol, tail_symbol, cut_shape, cut_dtype = split_tail(training_symbol, data_shape)
        tail = GlobalTail(tail_symbol, cut_shape, cfg.batch_size * world, ctx, cut_dtype)
    # the same math, faster
    training_symbol = fused_ops.fuse(training_symbol, data_shape) if ctx.device_type == "cpu" else training_symbol
    module = SampleDistributeModule(training_symbol, partial_fc, backbone_optimizer, context=ctx,
                                    batch_size=cfg.batch_size,
                                    data_shape=(3, cfg.image_size, cfg.image_size), allgather=cfg.allgather,
                                    max_nonfinite_steps=cfg.max_nonfinite_steps, tail=tail, seed=cfg.seed)
    initializer = backbone_initializer(cfg.backbone_init, cfg.network)
    arg_params, aux_params = pretrained or (initial_params(symbol, cfg.image_size, initializer) if tail
                                            else (None, None))     # fine-tuning: trained backbone weights
    module.init_params(initializer, arg_params, aux_params)
    module.broadcast_parameters()
    return module


def target_paths(cfg):
    """{name: path of <name>.bin next to the training data} of cfg.val_targets (found or not)."""
    folder = os.path.dirname(os.path.abspath(cfg.rec)) if cfg.rec else ""
    return {name: os.path.join(folder, name + ".bin") for name in cfg.val_targets}


def load_targets(cfg, logger):
    """{name: (images, issame)} of the val_targets found next to the training data."""
    targets = {}
    for name, path in target_paths(cfg).items():
        if os.path.isfile(path):
            targets[name] = load_bin(path, cfg.image_size)
        else:
            logger.warning("verification target %s not found at %s; skipped", name, path)
    return targets


def target_bytes(targets):
    """Bytes of the verification sets' images as load_targets holds them (the memory plan's)."""
    return sum(images.nbytes for images, _ in targets.values())


def setup_logger(rank):
    """The run's logger on stdout: rank 0 logs INFO, the others WARNING (see log_to_file)."""
    logger = logging.getLogger("sample_fc")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.handlers.clear()
    logger.propagate = False
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    return logger


def log_to_file(logger, path):
    """Also write the logger's lines to `path` (rank 0's train.log), in the same format."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logger.handlers[0].formatter)
    logger.addHandler(handler)


def complete_from_data(cfg, overrides, note):
    """A new run's config (config_for_run's, with its `key=value` overrides) completed from its
    data as train.py and tools.plan both take it: num_classes and image_size from the dataset's
    property file where the overrides do not name them (note(line) for each), then checked."""
    for line in fill_from_property(cfg, overridden_keys(overrides)):
        note(line)
    check_config(cfg)
    return cfg


def fill_from_property(cfg, explicit):
    """Take num_classes and image_size from the dataset's `property` file (beside cfg.rec)
    for the keys not in `explicit` (those the command line set); returns the lines to tell
    the user (what was taken, or that an explicit image size resizes the stored images). The
    dataset describes itself: a 112 px set is not trained at a preset's 32 px without a word.
    An explicit num_classes that disagrees is refused when the data is opened."""
    if cfg.synthetic or not cfg.rec:
        return {}
    prop = read_property(os.path.dirname(os.path.abspath(cfg.rec)))
    if prop is None:
        if cfg.num_classes < 1:          # the custom preset: the set must say its class count
            where = "not found" if not os.path.isfile(cfg.rec) else "has no property file beside it"
            raise UsageError(f"record file (.rec) {where}: {cfg.rec} (dataset {cfg.dataset} takes num_classes from "
                             f"the property file beside it, or --set num_classes=)")
        return {}
    num_classes, height, width = prop
    if height != width and "image_size" not in explicit:
        raise UsageError(f"the property beside {cfg.rec} says {height}x{width} images; training takes "
                         f"square inputs: set image_size (images are resized to it)")
    notes = []
    for key, value in (("num_classes", num_classes), ("image_size", height)):
        if key not in explicit and cfg[key] != value:
            cfg[key] = value
            notes.append(f"{key}={value} from the dataset's property file")
    if "image_size" in explicit and cfg.image_size != height:
        notes.append(f"the dataset's images are {height}x{width} px and train at image_size="
                     f"{cfg.image_size} (resized as they are read)")
    return notes


def resolve_auto(cfg, world):
    """The config's `auto` words, now that the global batch is known. sample_ratio=auto: the
    smallest ratio whose q*K/B reaches the measured safe level (sampling_regime.safe_ratio; 1.0
    where none does), with sample_wd_correction on from ratio 0.5 (where it measured as helping:
    BENCHMARKS.md); bank_momentum=auto: the centers' optimizer for the classes' visit gap
    (pfc/center_optimizer.py). Changes cfg in place (the run's config.json and checkpoints keep
    the values); returns {key: the line to log} for each key that was automatic."""
    lines, global_batch = {}, cfg.batch_size * world
    if cfg.sample_ratio == "auto":
        cfg.sample_ratio = safe_ratio(cfg.num_classes, global_batch)
        cfg.sample_wd_correction = cfg.sample_wd_correction or 0.5 <= cfg.sample_ratio < 1.0
        lines["sample_ratio"] = (f"sample_ratio=auto: {cfg.sample_ratio:g} for {cfg.num_classes:,} classes and a "
                                 f"global batch of {global_batch}"
                                 + (", with sample_wd_correction" if cfg.sample_wd_correction else ""))
    if cfg.bank_momentum == "auto":
        centers = center_optimizer("auto", cfg.momentum, cfg.num_classes, global_batch)
        cfg.bank_momentum = centers.bank_momentum
        lines["bank_momentum"] = centers.line()
    return lines


def centers_line(cfg, world, auto_lines):
    """The start-up line of the centers' optimizer: bank_momentum=auto's, or the one of the
    config's setting."""
    return auto_lines.get("bank_momentum") or center_optimizer(cfg.bank_momentum, cfg.momentum, cfg.num_classes,
                                                               cfg.batch_size * world).line()


def check_world(cfg, world):
    """Config checks that need the world size (UsageError naming the values and the fix)."""
    if cfg.num_classes < world:
        raise UsageError(f"num_classes={cfg.num_classes} is less than the {world} workers: every "
                         f"worker needs at least one class center; use at most {cfg.num_classes} "
                         f"workers (-np) or a dataset with more classes")


def open_run(cfg, models_root, request, world, logger):
    """Everything of a run that can be checked before anything is written (no collectives,
    no writes): UsageError naming the problem. `request` is the job's run_request.RunRequest,
    `world` a dist.World (rank, size, local rank and size). The models root must not be in use by
    another job (rank 0 checks its lock), and a fresh start must not overwrite a run's checkpoints
    unless --start-over; a resume takes only checkpoints of the continued run
    (request.continued_run; None: any); the run's memory plan must fit this node
    (memory_plan.check_memory, before anything is allocated). Returns this rank's RunRecord."""
    rank = world.rank
    resume_path, pretrained = request.resume, request.pretrained
    if os.path.exists(models_root) and not os.path.isdir(models_root):
        raise UsageError(f"--models-root {models_root} is a file, not a directory")
    if rank == 0:
        run_root.check_not_in_use(models_root, request.lock_token)
    if not resume_path and not request.start_over:
        run_root.check_fresh_start(models_root)
    check_world(cfg, world.size)
    scalar_log.check_available(cfg)
    warn = logger.warning if rank == 0 else (lambda message: None)
    ctx, bank_ctx = resolve_contexts(cfg, world.local_rank, warn)
    symbol = build_symbol(cfg)
    if cfg.tail_bn == "global":      # the network can be split there (UsageError before anything is written)
        split_tail(symbol, (cfg.batch_size, 3, cfg.image_size, cfg.image_size))
    targets = load_targets(cfg, logger)
    plan, _ = memory_plan.check_memory(cfg, world.size, symbol, ctx, bank_ctx, world.local_size,
                                       target_bytes(targets),
                                       lambda device_id: mx.context.gpu_memory_info(device_id)[0])
    resume_from, state = resume.choose(resume_path, symbol, cfg.image_size, cfg.network, warn,
                                       request.continued_run) if resume_path else (None, {})
    checkpoint.check_space(models_root, plan.checkpoint)
    if pretrained and resume_path:
        raise UsageError("--pretrained starts a new run from trained weights; --resume continues "
                         "one: give one of them")
    say = logger.info if rank == 0 else (lambda message: None)
    weights = load_pretrained(pretrained, symbol, cfg.image_size, cfg.network, say) if pretrained else None
    cost = backbone_cost(symbol, cfg.image_size)
    sampling = regime(cfg.sample_ratio, cfg.num_classes, world.size, cfg.batch_size, cfg.embedding_size,
                      cost.multiply_adds)
    parts = RunParts(logger=logger, symbol=symbol, pretrained=weights, train_iter=build_iterator(cfg, rank, world.size),
                     ctx=ctx, bank_ctx=bank_ctx, targets=targets)
    return RunRecord(cfg=cfg, rank=rank, world=world.size, models_root=models_root, run_id=request.run_id(state),
                     resume_from=resume_from, resumed_at=state.get("step"), cost=cost, plan=plan, sampling=sampling,
                     parts=parts)
