"""A trained backbone on disk: find it, load it for the tools (verify, embed, export), load
its weights alone for fine-tuning (train.py --pretrained), and compare saved parameters with
a network.

A model spec `PREFIX[,EPOCH]` names what mx.model.load_checkpoint(PREFIX, EPOCH) reads:
PREFIX-symbol.json and PREFIX-EPOCH.params (EPOCH printed with at least 4 digits). PREFIX
may also be a directory:
    a checkpoint dir `step-XXXXXXXX/`     its `model` prefix (checkpoint/layout.py)
    a models root                          its newest complete checkpoint, or with EPOCH the
                                           complete step-<EPOCH>/
Without EPOCH the largest one found for the prefix is used. `.partial` directories are never used.
"""
import os
import re
from dataclasses import dataclass
from typing import Optional

import mxnet as mx

from . import checkpoint
from .errors import MissingFileError, UsageError

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
        raise MissingFileError(f"--model {path}: neither {path}-symbol.json nor a directory exists")
    if path.rstrip(os.sep).endswith(checkpoint.PARTIAL_SUFFIX):
        raise UsageError(f"--model {path}: an incomplete checkpoint (.partial); use a complete one")
    if os.path.isfile(checkpoint.symbol_path(path)):
        return checkpoint.model_prefix(path)
    return checkpoint.model_prefix(checkpoint.find_checkpoint(path, epoch, option="--model"))


def available_epochs(prefix):
    folder, base = os.path.split(prefix)
    pattern = re.compile(re.escape(base) + r"-(\d+)\.params$")
    names = os.listdir(folder or ".")
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def _read_config(prefix):
    """The training config saved beside a checkpoint's prefix, or None (a plain MXNet model)."""
    folder = os.path.dirname(prefix)
    if not os.path.isfile(checkpoint.state_path(folder)):
        return None
    return checkpoint.read_state(folder, needs=()).get("config")


def _embedding_output(symbol, symbol_file):
    if len(symbol.list_outputs()) == 1:
        return symbol
    internals = symbol.get_internals()
    if "embeddings_output" in internals.list_outputs():
        return internals["embeddings_output"]
    raise UsageError(f"{symbol_file}: expected one output (the embeddings), found "
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
        raise UsageError(f"cannot infer the input size from the params (sides that fit among "
                         f"{IMAGE_SIZES[0]}..{IMAGE_SIZES[-1]}: {fits or 'none'}); pass --image-size")
    return fits[0]


def load_model(spec, image_size=None):
    """LoadedModel from a --model spec; errors (FileNotFoundError, ValueError) name the path."""
    path, epoch = parse_model_spec(spec)
    prefix = resolve_prefix(path, epoch)
    if epoch is None:
        epochs = available_epochs(prefix)
        if not epochs:
            raise MissingFileError(f"--model {spec}: no {prefix}-NNNN.params next to {prefix}-symbol.json")
        epoch = epochs[-1]
    params_file = "%s-%04d.params" % (prefix, epoch)
    if not os.path.isfile(params_file):
        raise MissingFileError(f"--model {spec}: {params_file} does not exist "
                                f"(epochs there: {available_epochs(prefix) or 'none'})")
    try:
        symbol, arg_params, aux_params = mx.model.load_checkpoint(prefix, epoch)
    except mx.base.MXNetError as err:
        raise UsageError(f"--model {spec}: cannot load {prefix}-symbol.json / {params_file}: "
                         f"{str(err).splitlines()[0]}") from err
    symbol = _embedding_output(symbol, prefix + "-symbol.json")
    missing = [n for n in symbol.list_arguments() if n != "data" and n not in arg_params]
    missing += [n for n in symbol.list_auxiliary_states() if n not in aux_params]
    if missing:
        raise UsageError(f"{params_file} lacks parameters of the symbol: {', '.join(missing[:10])}")
    arg_params = {n: arg_params[n] for n in symbol.list_arguments() if n != "data"}
    aux_params = {n: aux_params[n] for n in symbol.list_auxiliary_states()}
    if image_size is None:
        image_size = infer_image_size(symbol, arg_params, aux_params)
    elif image_size <= 0 or not params_fit(symbol, arg_params, aux_params, image_size):
        raise UsageError(f"--image-size {image_size}: the params of {params_file} do not fit "
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
        raise MissingFileError(f"--pretrained {spec}: {params} does not exist")
    try:
        loaded = mx.nd.load(params)
    except mx.base.MXNetError as err:
        raise UsageError(f"--pretrained {spec}: {params} cannot be read "
                         f"({str(err).strip().splitlines()[-1]})") from None
    differences = param_differences(loaded, symbol, image_size)
    if differences:
        raise UsageError(f"--pretrained {spec} does not fit this run's network {network!r} at "
                         f"{image_size} px: {differences[0]} ({len(differences)} differences)")
    return ({k[4:]: v for k, v in loaded.items() if k.startswith("arg:")},
            {k[4:]: v for k, v in loaded.items() if k.startswith("aux:")})


def param_differences(loaded, symbol, image_size):
    """How saved params ({"arg:name"/"aux:name": NDArray}, as mx.nd.load gives them) differ
    from what `symbol` needs at this input size: a list of "layer ..." sentences."""
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, image_size, image_size))
    want = {f"arg:{n}": tuple(s) for n, s in zip(symbol.list_arguments(), arg_shapes) if n != "data"}
    want.update({f"aux:{n}": tuple(s) for n, s in zip(symbol.list_auxiliary_states(), aux_shapes)})
    have = {name: tuple(array.shape) for name, array in loaded.items()}
    differences = [f"{name[4:]} is missing" for name in sorted(set(want) - set(have))]
    differences += [f"{name[4:]} has shape {have[name]}, this run needs {want[name]}"
                    for name in sorted(set(want) & set(have)) if have[name] != want[name]]
    differences += [f"{name[4:]} is not in this run's network" for name in sorted(set(have) - set(want))]
    return differences
