"""The tools' model options (--model, --image-size, --context, --batch-size); loading is
sample_fc.models.saved_model's."""
import argparse
import os
import re

import mxnet as mx

from ..checkpoint import verify_files
from ..errors import UsageError
from ..run.gpus import check_gpu_context
from ..models.saved_model import (NORMALIZE_CHOICES, LoadedModel, load_model, parse_model_spec,  # noqa: F401
                                  resolve_prefix)


def add_model_arguments(parser, batch_size=True):
    """--model, --image-size, --context and (if batch_size) --batch-size, for the tools."""
    parser.add_argument("--model", required=True, metavar="PREFIX[,EPOCH]",
                        help="checkpoint prefix (PREFIX-symbol.json, PREFIX-EPOCH.params), a "
                             "checkpoint dir step-XXXXXXXX/, a models root (its newest "
                             "complete checkpoint), arcface_torch's backbone.pth (.pth/.pt), or "
                             "an ONNX model (.onnx, run by onnxruntime); EPOCH defaults to the largest found")
    parser.add_argument("--network", default=None, metavar="NAME",
                        help="for a .pth: the network it holds (r50, mbf, ...); default: the one "
                             "whose parameter shapes fit")
    parser.add_argument("--image-size", type=int, default=None,
                        help="input side; default: inferred from the params' shapes")
    parser.add_argument("--output", default=None, metavar="NAME",
                        help="the layer (or output) whose values are the embedding; default: "
                             "embeddings (sample_fc's), else fc1 (insightface's MXNet models), else "
                             "the graph's only output")
    parser.add_argument("--normalize", default="auto", choices=NORMALIZE_CHOICES,
                        help="who turns raw pixels 0..255 into (x - 127.5) / 128 (an ONNX model: "
                             "/ 127.5): the graph, or this tool before it; default auto: the graph "
                             "if its input meets an arithmetic op or a BatchNorm first")
    if batch_size:
        parser.add_argument("--batch-size", type=int, default=None,
                            help="images per forward pass; default: the checkpoint's training "
                                 "batch size (from its state.json), else 64")
    parser.add_argument("--context", default="cpu", type=_context_argument, metavar="cpu|gpu:N",
                        help="device to run on (default cpu)")


def load_model_from_args(args):
    """The model the tool's --model, --image-size, --output, --normalize and --network name,
    after checking that --context names a device MXNet has and that a checkpoint's backbone files
    match the checksums they were saved with (UsageError naming the file)."""
    check_context(args.context)
    path, epoch = parse_model_spec(args.model)
    if os.path.isdir(path):             # a checkpoint or a models root: the checkpoint's files as written
        verify_files(os.path.dirname(resolve_prefix(path, epoch)), files="backbone")
    return load_model(args.model, args.image_size, args.output, args.normalize, args.network)


def check_context(ctx):
    """UsageError when `ctx` is a GPU that MXNet does not see (a CPU-only build sees none) or
    cannot run on (sample_fc.run.gpus)."""
    check_gpu_context(ctx)
    if ctx.device_type == "gpu" and ctx.device_id >= mx.context.num_gpus():
        raise UsageError(f"--context gpu:{ctx.device_id}: MXNet sees {mx.context.num_gpus()} GPU(s) "
                         f"here; use --context cpu")


def parse_context(text):
    """'cpu', 'cpu:N', 'gpu' or 'gpu:N' -> mx.Context (UsageError otherwise)."""
    match = re.fullmatch(r"(cpu|gpu)(?::(\d+))?", text.strip())
    if not match:
        raise UsageError(f"context must be cpu, gpu or gpu:N, got {text!r}")
    return mx.Context(match.group(1), int(match.group(2) or 0))


def _context_argument(text):
    try:
        return parse_context(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def batch_size_or_default(batch_size, model, default=64):
    """The explicit batch size, else the one the model was trained with (so verify runs the
    backbone on batches of the same size as training's verification did), else `default`."""
    if batch_size is not None:
        if batch_size <= 0:
            raise UsageError(f"--batch-size must be positive, got {batch_size}")
        return batch_size
    return int((model.config or {}).get("batch_size", default))
