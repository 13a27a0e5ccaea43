"""Choosing the checkpoint a run resumes from, and checking it completely before use.

`--resume PATH` names a checkpoint directory or a models root. A models root offers its
complete checkpoints newest first; one that turns out damaged (a file missing, empty,
truncated or unreadable) is skipped with a warning and the previous one is used. A
checkpoint named directly must be intact. The check reads every small file and the
backbone's parameters, and compares the bank shards' sizes with what their shapes need, so
restoring never meets a missing file (MXNet can crash on one) or a shape it cannot load.
"""
import json
import os

import mxnet as mx

from .checkpoint import (OPTIMIZER_FILE, aux_path, bank_shard_paths, find_checkpoint, list_checkpoints,
                         model_prefix)
from .checkpoint import saved_state as checkpoint_state
from .sampler import shard_range


def candidates(path):
    """Checkpoints to try for --resume PATH, in order (FileNotFoundError if there is none)."""
    if os.path.isfile(os.path.join(path, "COMPLETE")):
        return [path]
    find_checkpoint(path)                      # raises, naming PATH, when there is no complete one
    return [checkpoint for _, checkpoint in reversed(list_checkpoints(path))]


def models_root_of(path):
    """The models root a --resume PATH belongs to (the checkpoint's parent, or PATH)."""
    return os.path.dirname(os.path.abspath(path)) if os.path.isfile(os.path.join(path, "COMPLETE")) else path


def saved_state(checkpoint):
    """state.json of a checkpoint with the step, world size and config a resume needs."""
    return checkpoint_state(checkpoint, needs=("step", "world_size", "config"))


def saved_config(path):
    """The config saved with the newest candidate whose state.json reads (see candidates)."""
    problems = []
    for checkpoint in candidates(path):
        try:
            return saved_state(checkpoint)["config"]
        except ValueError as err:
            problems.append(str(err))
    raise ValueError(f"--resume {path}: no readable checkpoint ({'; '.join(problems)})")


def verify(checkpoint, symbol, image_size, network):
    """ValueError naming the missing or bad file, or how the checkpoint differs from this
    run's backbone (`symbol` of `network`), unless everything restore reads is sound."""
    state = saved_state(checkpoint)
    step, world, saved = state["step"], state["world_size"], state["config"]
    params = f"{model_prefix(checkpoint)}-{step:04d}.params"
    shards = bank_shard_paths(checkpoint, world)
    ranks = [os.path.join(checkpoint, f"rank{r}.json") for r in range(world)]
    auxes = [aux_path(checkpoint, r) for r in range(world)]
    for path in [model_prefix(checkpoint) + "-symbol.json", params,
                 os.path.join(checkpoint, OPTIMIZER_FILE)] + shards + ranks + auxes:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise ValueError(f"checkpoint {checkpoint} is damaged: {os.path.basename(path)} is missing or empty")
    for path in ranks:
        try:
            with open(path) as handle:
                json.load(handle)
        except (OSError, ValueError) as err:
            raise ValueError(f"checkpoint {checkpoint} is damaged: {os.path.basename(path)} ({err})") from None
    for rank, path in enumerate(shards):        # weight + momentum rows of float32, and a header
        _, num_local = shard_range(saved["num_classes"], rank, world)
        if os.path.getsize(path) < 2 * 4 * num_local * saved["embedding_size"]:
            raise ValueError(f"checkpoint {checkpoint} is damaged: {os.path.basename(path)} is truncated "
                             f"({os.path.getsize(path)} bytes for {num_local} classes)")
    try:
        loaded = mx.nd.load(params)
    except mx.base.MXNetError as err:
        raise ValueError(f"checkpoint {checkpoint} is damaged: {os.path.basename(params)} cannot be read "
                         f"({str(err).strip().splitlines()[-1]})") from None
    _check_shapes(checkpoint, loaded, symbol, image_size, saved.get("network"), network)
    return state


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


def _check_shapes(checkpoint, loaded, symbol, image_size, saved_network, network):
    differences = param_differences(loaded, symbol, image_size)
    if differences:
        raise ValueError(f"checkpoint {checkpoint} holds network {saved_network!r} and this run builds "
                         f"{network!r}: {differences[0]} ({len(differences)} differences)")


def choose(path, symbol, image_size, network, warn):
    """The first sound checkpoint of candidates(path) and its state; warn(message) for each
    damaged one skipped. ValueError with every reason when none is usable."""
    tried = candidates(path)
    reasons = []
    for checkpoint in tried:
        try:
            return checkpoint, verify(checkpoint, symbol, image_size, network)
        except ValueError as err:
            if len(tried) == 1 or "holds network" in str(err):   # named directly, or another model
                raise
            reasons.append(str(err))
            warn(f"{err}; trying the previous complete checkpoint")
    raise ValueError(f"--resume {path}: no usable checkpoint ({'; '.join(reasons)})")
