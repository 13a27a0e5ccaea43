"""Train a face-recognition embedding with Partial FC on Horovod workers.

    horovodrun -np 8 -H localhost:8 python train.py --dataset emore --network r100 --loss arcface \
        --models-root models/r100 [--set key=value ...] [--resume models/r100]
Every rank runs this; rank 0 logs, writes config.json and the backbone of each checkpoint.
"""
import argparse
import os
import sys

import mxnet as mx
import numpy as np

import default
from sample_fc import builder, checkpoint, dist
from sample_fc.callbacks import PeriodicCallback, ProgressLogger, VerificationRunner
from sample_fc.config import apply_overrides, format_config, save_config
from sample_fc.verification import Embedder, evaluate, raw_pixel_embed, to_nchw


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="demo", choices=default.DATASETS)
    parser.add_argument("--network", "--net", default=None, choices=default.NETWORKS,
                        help="default: the dataset's (write --net under a plain horovodrun, whose "
                             "parser mistakes --network for its --network-interface)")
    parser.add_argument("--loss", default="arcface", choices=default.LOSSES)
    parser.add_argument("--models-root", default=None, help="output dir (default models/<dataset>_<network>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key (repeatable); see default.py")
    parser.add_argument("--resume", default=None, metavar="DIR",
                        help="a checkpoint dir, or a models root whose newest complete checkpoint to use")
    return parser


def build_config(args):
    cfg = default.get_config(args.dataset, args.network or default.get_config(args.dataset).network, args.loss)
    for text in args.overrides:
        if text.split("=", 1)[0] in ("dataset", "network", "loss"):
            raise ValueError(f"--set {text}: choose presets with --dataset/--network/--loss instead")
    apply_overrides(cfg, args.overrides)
    default.check_config(cfg)
    return cfg


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        cfg = build_config(args)
    except ValueError as error:
        parser.error(str(error))          # exits 2 with the message, on every rank
    dist.init(stall_shutdown_s=cfg.collective_timeout_s)
    try:
        return train(cfg, args)
    except mx.base.MXNetError as error:
        if dist.is_shutdown_error(error):
            print(f"[rank {dist.rank()}] ERROR: Horovod shut the job down while this rank waited in a "
                  f"collective: another rank failed or stalled for more than collective_timeout_s="
                  f"{cfg.collective_timeout_s} s (rank 0's 'Missing ranks' report names it)",
                  file=sys.stderr, flush=True)
        raise


def train(cfg, args):
    """The training job on this rank, Horovod initialised; returns the exit code (0)."""
    rank, world = dist.rank(), dist.size()
    models_root = args.models_root or os.path.join("models", f"{cfg.dataset}_{cfg.network}")
    os.makedirs(models_root, exist_ok=True)
    logger = builder.setup_logger(rank, models_root)
    if rank == 0:
        save_config(cfg, os.path.join(models_root, "config.json"))
        logger.info("world size %d, config:\n%s", world, format_config(cfg))
    ctx, bank_ctx = builder.resolve_contexts(cfg, dist.local_rank())
    mx.random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    train_iter = builder.build_iterator(cfg, rank, world)
    symbol = builder.build_symbol(cfg)
    module = builder.build_module(cfg, symbol, rank, world, ctx, bank_ctx, logger)
    if args.resume:
        resume_from = checkpoint.find_checkpoint(args.resume)
        step = checkpoint.restore_checkpoint(resume_from, module, train_iter, cfg.num_classes,
                                             cfg.embedding_size)
        logger.info("resumed from %s at step %d", resume_from, step)

    saved_steps = set()
    train_state = {"world_size": world, "num_classes": cfg.num_classes,
                   "embedding_size": cfg.embedding_size, "config": cfg}

    def save(step):
        saved_steps.add(step)
        checkpoint.save_checkpoint(models_root, step, module, symbol, train_iter, train_state, cfg.ckpt_keep)
        logger.info("step %d: checkpoint saved", step)

    def embed_images(images):
        arg_params, aux_params = module.get_export_params()
        embed = Embedder(symbol, arg_params, aux_params, ctx, cfg.image_size, batch_size=cfg.batch_size)
        return embed(to_nchw(images))

    writer = builder.tensorboard_writer(cfg, rank, models_root)
    verify = VerificationRunner(builder.load_targets(cfg, logger), embed_images, logger, models_root, writer)
    callbacks = [PeriodicCallback(cfg.ckpt_period, save), PeriodicCallback(cfg.verbose, verify)]
    if rank == 0:
        callbacks.insert(0, ProgressLogger(cfg.frequent, cfg.max_update, logger, writer))
    module.fit(train_iter, cfg.max_update, callbacks)

    if module.num_update not in saved_steps:      # a run always ends with a checkpoint
        save(module.num_update)
    if not cfg.verbose or module.num_update % cfg.verbose:
        verify(module.num_update)
    for name, (images, issame) in (verify.targets.items() if rank == 0 else ()):
        baseline = evaluate(raw_pixel_embed, images, issame)
        logger.info("final %s: accuracy %.4f (raw-pixel cosine baseline %.4f)",
                    name, verify.last[name].accuracy, baseline.accuracy)
    logger.info("done: %d steps, checkpoints in %s", module.num_update, models_root)
    mx.nd.waitall()              # an orderly exit: no pending MXNet ops, decoders, or Horovod
    if hasattr(train_iter, "close"):
        train_iter.close()
    dist.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
