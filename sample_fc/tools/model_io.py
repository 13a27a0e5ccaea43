"""Load a trained backbone: for the command-line tools (verify, embed, export), and its
weights alone for fine-tuning (load_pretrained, train.py --pretrained).

`--model PREFIX[,EPOCH]` names what mx.model.load_checkpoint(PREFIX, EPOCH) reads:
PREFIX-symbol.json and PREFIX-EPOCH.params (EPOCH printed with at least 4 digits). PREFIX
may also be a directory:
    a checkpoint dir `step-XXXXXXXX/`     its `model` prefix (sample_fc.checkpoint layout)
    a models root                          its newest complete checkpoint (one with COMPLETE),
                                           or with EPOCH the complete step-<EPOCH>/
Without EPOCH the largest one found for the prefix is used.

Checkpoints are found with sample_fc.checkpoint (which needs no Horovod for that);
`.partial` directories are never used.
"""
import argparse
import json
import os
import re
from dataclasses import dataclass
from typing import Optional

import mxnet as mx

from .. import resume
from ..checkpoint import find_checkpoint, model_prefix
IMAGE_SIZES = tuple(range(16, 513, 16))              # sides tried when inferring the input size


@dataclass
class LoadedModel:
    symbol: mx.sym.Symbol       # single output: the embeddings (N, D)
    arg_params: dict            # name -> mx.nd.NDArray, only those the symbol uses
    aux_params: dict
    prefix: str
    epoch: int
    image_size: int             # side of the square input the params fit
    config: Optional[dict]      # training config from the checkpoint's state.json, if any


def add_model_arguments(parser, batch_size=True):
    """--model, --image-size, --context and (if batch_size) --batch-size, for the tools."""
    parser.add_argument("--model", required=True, metavar="PREFIX[,EPOCH]",
                        help="checkpoint prefix (PREFIX-symbol.json, PREFIX-EPOCH.params), a "
                             "checkpoint dir step-XXXXXXXX/, or a models root (its newest "
                             "complete checkpoint); EPOCH defaults to the largest found")
    parser.add_argument("--image-size", type=int, default=None,
                        help="input side; default: inferred from the params' shapes")
    if batch_size:
        parser.add_argument("--batch-size", type=int, default=None,
                            help="images per forward pass; default: the checkpoint's training "
                                 "batch size (from its state.json), else 64")
    parser.add_argument("--context", default="cpu", type=_context_argument, metavar="cpu|gpu:N",
                        help="device to run on (default cpu)")


def parse_context(text):
    """'cpu', 'cpu:N', 'gpu' or 'gpu:N' -> mx.Context (ValueError otherwise)."""
    match = re.fullmatch(r"(cpu|gpu)(?::(\d+))?", text.strip())
    if not match:
        raise ValueError(f"context must be cpu, gpu or gpu:N, got {text!r}")
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
            raise ValueError(f"--batch-size must be positive, got {batch_size}")
        return batch_size
    return int((model.config or {}).get("batch_size", default))


def parse_model_spec(spec):
    """'PREFIX[,EPOCH]' -> (PREFIX, EPOCH or None)."""
    prefix, comma, epoch = spec.rpartition(",")
    if comma and re.fullmatch(r"\d+", epoch.strip()):
        return prefix, int(epoch)
    return spec, None


def resolve_prefix(path, epoch=None):
    """A load_checkpoint prefix from a prefix, a checkpoint dir or a models root (there the
    checkpoint of step `epoch`, or the newest)."""
    if os.path.isfile(path + "-symbol.json"):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--model {path}: neither {path}-symbol.json nor a directory exists")
    if path.rstrip(os.sep).endswith(".partial"):
        raise ValueError(f"--model {path}: an incomplete checkpoint (.partial); use a complete one")
    inside = model_prefix(path)
    if os.path.isfile(inside + "-symbol.json"):
        return inside
    return model_prefix(find_checkpoint(path, epoch, option="--model"))


def available_epochs(prefix):
    folder, base = os.path.split(prefix)
    pattern = re.compile(re.escape(base) + r"-(\d+)\.params$")
    names = os.listdir(folder or ".")
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def _read_config(prefix):
    state = os.path.join(os.path.dirname(prefix), "state.json")
    if not os.path.isfile(state):
        return None
    with open(state) as handle:
        return json.load(handle).get("config")


def _embedding_output(symbol, symbol_file):
    if len(symbol.list_outputs()) == 1:
        return symbol
    internals = symbol.get_internals()
    if "embeddings_output" in internals.list_outputs():
        return internals["embeddings_output"]
    raise ValueError(f"{symbol_file}: expected one output (the embeddings), found "
                     f"{symbol.list_outputs()} and no 'embeddings_output'")


def params_fit(symbol, arg_params, aux_params, side):
    """Whether every parameter shape of `symbol` at input side `side` matches the params."""
    try:   # the _partial variant raises without printing every shape to stdout
        arg_shapes, _, aux_shapes = symbol.infer_shape_partial(data=(1, 3, side, side))
    except mx.base.MXNetError:
        return False                   # e.g. too small for the network's kernels
    got = dict(zip(symbol.list_arguments(), arg_shapes))
    got.update(zip(symbol.list_auxiliary_states(), aux_shapes))
    return all(tuple(got[n]) == params[n].shape
               for params in (arg_params, aux_params) for n in params)


def infer_image_size(symbol, arg_params, aux_params):
    """The one side in IMAGE_SIZES at which the params fit `symbol` (the embedding FC's input
    width fixes it for the project's backbones); ValueError if none or several do."""
    fits = [side for side in IMAGE_SIZES if params_fit(symbol, arg_params, aux_params, side)]
    if len(fits) != 1:
        raise ValueError(f"cannot infer the input size from the params (sides that fit among "
                         f"{IMAGE_SIZES[0]}..{IMAGE_SIZES[-1]}: {fits or 'none'}); pass --image-size")
    return fits[0]


def load_model(spec, image_size=None):
    """LoadedModel from a --model spec; errors (FileNotFoundError, ValueError) name the path."""
    path, epoch = parse_model_spec(spec)
    prefix = resolve_prefix(path, epoch)
    if epoch is None:
        epochs = available_epochs(prefix)
        if not epochs:
            raise FileNotFoundError(f"--model {spec}: no {prefix}-NNNN.params next to {prefix}-symbol.json")
        epoch = epochs[-1]
    params_file = "%s-%04d.params" % (prefix, epoch)
    if not os.path.isfile(params_file):
        raise FileNotFoundError(f"--model {spec}: {params_file} does not exist "
                                f"(epochs there: {available_epochs(prefix) or 'none'})")
    try:
        symbol, arg_params, aux_params = mx.model.load_checkpoint(prefix, epoch)
    except mx.base.MXNetError as err:
        raise ValueError(f"--model {spec}: cannot load {prefix}-symbol.json / {params_file}: "
                         f"{str(err).splitlines()[0]}") from err
    symbol = _embedding_output(symbol, prefix + "-symbol.json")
    missing = [n for n in symbol.list_arguments() if n != "data" and n not in arg_params]
    missing += [n for n in symbol.list_auxiliary_states() if n not in aux_params]
    if missing:
        raise ValueError(f"{params_file} lacks parameters of the symbol: {', '.join(missing[:10])}")
    arg_params = {n: arg_params[n] for n in symbol.list_arguments() if n != "data"}
    aux_params = {n: aux_params[n] for n in symbol.list_auxiliary_states()}
    if image_size is None:
        image_size = infer_image_size(symbol, arg_params, aux_params)
    elif image_size <= 0 or not params_fit(symbol, arg_params, aux_params, image_size):
        raise ValueError(f"--image-size {image_size}: the params of {params_file} do not fit "
                         f"{image_size}x{image_size} inputs; omit --image-size to infer it")
    return LoadedModel(symbol, arg_params, aux_params, prefix, epoch, image_size, _read_config(prefix))


def load_pretrained(spec, symbol, image_size, network):
    """(arg_params, aux_params) of a trained backbone for fine-tuning: `spec` is PREFIX[,EPOCH]
    (as mx.model.load_checkpoint), a checkpoint dir or a models root. Only the .params file
    is read (MXNet's NDArray format, never the optimizer state); ValueError naming the layer
    when it does not fit this run's `symbol`."""
    path, epoch = parse_model_spec(spec)
    prefix = resolve_prefix(path, epoch)
    epoch = epoch if epoch is not None else (available_epochs(prefix) or [None])[-1]
    params = f"{prefix}-{epoch:04d}.params" if epoch is not None else f"{prefix}-NNNN.params"
    if not os.path.isfile(params):
        raise FileNotFoundError(f"--pretrained {spec}: {params} does not exist")
    try:
        loaded = mx.nd.load(params)
    except mx.base.MXNetError as err:
        raise ValueError(f"--pretrained {spec}: {params} cannot be read "
                         f"({str(err).strip().splitlines()[-1]})") from None
    differences = resume.param_differences(loaded, symbol, image_size)
    if differences:
        raise ValueError(f"--pretrained {spec} does not fit this run's network {network!r} at "
                         f"{image_size} px: {differences[0]} ({len(differences)} differences)")
    return ({k[4:]: v for k, v in loaded.items() if k.startswith("arg:")},
            {k[4:]: v for k, v in loaded.items() if k.startswith("aux:")})
