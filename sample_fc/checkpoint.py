"""Training checkpoints: complete-or-absent directories, the last K kept.

Layout of one checkpoint, `<models_root>/step-00000300/`:
    model-symbol.json, model-0300.params   backbone, loadable by mx.model.load_checkpoint
    backbone.states                         backbone optimizer state (momentum)
    bank-rank<r>.params                     every rank's bank shard (weight, momentum, metadata)
    rank<r>.json                            every rank's sampler RNG and data position
    state.json                              step, world size, class count, config
    COMPLETE                                written last
Every rank writes into `step-XXXXXXXX.partial`; after a barrier rank 0 writes COMPLETE and
renames the directory, so a kill at any point leaves either the finished checkpoint or a
`.partial` directory that resume ignores. For multi-node jobs `models_root` must be on a
filesystem every node sees. Finding and reading checkpoints needs no Horovod (the tools
use this module without it); saving and restoring import sample_fc.dist when called.
"""
import json
import os
import re
import shutil

import mxnet as mx

from .config import write_json

PATTERN = re.compile(r"^step-(\d{8})$")
MODEL_PREFIX = "model"


def checkpoint_path(models_root, step):
    return os.path.join(models_root, f"step-{step:08d}")


def model_prefix(checkpoint):
    """The prefix for mx.model.load_checkpoint(prefix, step) inside a checkpoint."""
    return os.path.join(checkpoint, MODEL_PREFIX)


def list_checkpoints(models_root):
    """[(step, path)] of complete checkpoints (with a COMPLETE file), oldest first."""
    if not os.path.isdir(models_root):
        return []
    found = []
    for name in os.listdir(models_root):
        match = PATTERN.match(name)
        path = os.path.join(models_root, name)
        if match and os.path.isfile(os.path.join(path, "COMPLETE")):
            found.append((int(match.group(1)), path))
    return sorted(found)


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(models_root, step, module, symbol, data_iter, train_state, keep):
    """Write checkpoint `step`. Every rank must call it (it has named barriers).

    train_state: JSON-able dict, the same on all ranks (written by rank 0 to state.json).
    Each rank writes its sampler's RNG and data_iter's position (rank<r>.json).
    keep: number of complete checkpoints to keep (older ones are deleted).
    """
    from . import dist
    rank = dist.rank()
    final = checkpoint_path(models_root, step)
    partial = final + ".partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    dist.barrier(f"checkpoint.{step}.begin")

    module.bank.save(os.path.join(partial, f"bank-rank{rank}.params"))
    write_json(os.path.join(partial, f"rank{rank}.json"),
               {"sampler": module.sampler.state_dict(), "data": data_iter.state_dict()})
    arg_params, aux_params = module.get_export_params()        # collective
    if rank == 0:
        mx.model.save_checkpoint(model_prefix(partial), step, symbol, arg_params, aux_params,
                                 remove_amp_cast=False)
        module.backbone.save_optimizer_states(os.path.join(partial, "backbone.states"))
        write_json(os.path.join(partial, "state.json"), dict(train_state, step=step))
    dist.barrier(f"checkpoint.{step}.written")

    if rank == 0:
        write_json(os.path.join(partial, "COMPLETE"), {"step": step})
        _fsync_dir(partial)
        if os.path.exists(final):            # re-saving a step, e.g. after resume
            shutil.rmtree(final)
        os.rename(partial, final)
        _fsync_dir(models_root)
        for _, old in list_checkpoints(models_root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier(f"checkpoint.{step}.done")
    return final


def read_state(checkpoint):
    with open(os.path.join(checkpoint, "state.json")) as handle:
        return json.load(handle)


def read_rank_state(checkpoint, rank):
    with open(os.path.join(checkpoint, f"rank{rank}.json")) as handle:
        return json.load(handle)


def bank_shard_paths(checkpoint, world_size):
    return [os.path.join(checkpoint, f"bank-rank{r}.params") for r in range(world_size)]


def find_checkpoint(path, step=None, option="--resume"):
    """A complete checkpoint directory: `path` itself when it is one (and step is None), else
    the newest complete checkpoint under the models root `path`, or the one of `step`.
    Incomplete (.partial) checkpoints are never used. FileNotFoundError names `option`."""
    if step is None and os.path.isfile(os.path.join(path, "COMPLETE")):
        return path
    found = dict(list_checkpoints(path))
    if not found:
        raise FileNotFoundError(f"{option} {path}: no complete checkpoint (step-XXXXXXXX/ with a "
                                f"COMPLETE file) there")
    if step is None:
        return found[max(found)]
    if step not in found:
        raise FileNotFoundError(f"{option} {path},{step}: no complete checkpoint step-{step:08d}/ "
                                f"there (complete: {', '.join(map(str, sorted(found)))})")
    return found[step]


def compatible_state(checkpoint, num_classes, embedding_size):
    """The checkpoint's state.json, checked against this run's num_classes and
    embedding_size (ValueError naming the key and both values)."""
    try:
        state = read_state(checkpoint)
    except (OSError, ValueError) as err:
        raise ValueError(f"checkpoint {checkpoint}: cannot read state.json ({err})") from None
    for key, want in (("num_classes", num_classes), ("embedding_size", embedding_size)):
        if state.get(key) != want:
            raise ValueError(f"checkpoint {checkpoint} was trained with {key}={state.get(key)}, "
                             f"this run has {key}={want}")
    return state


def restore_checkpoint(checkpoint, module, data_iter, num_classes, embedding_size):
    """Load a checkpoint into a built module (and data iterator); returns its step.

    Same world size: everything continues exactly (bank shard, sampler RNG, data position).
    Different world size: the bank is re-split from all old shards and the data position
    is carried over approximately (the same epoch, the same fraction of it).
    """
    from . import dist
    state = compatible_state(checkpoint, num_classes, embedding_size)
    step, old_world, rank = state["step"], state["world_size"], dist.rank()
    _, arg_params, aux_params = mx.model.load_checkpoint(model_prefix(checkpoint), step)
    module.backbone.set_params(arg_params, aux_params, allow_missing=False)
    module.backbone.load_optimizer_states(os.path.join(checkpoint, "backbone.states"))
    module.set_num_update(step)
    if old_world == dist.size():
        module.bank.load(bank_shard_paths(checkpoint, old_world)[rank])
        rank_state = read_rank_state(checkpoint, rank)
        module.sampler.load_state_dict(rank_state["sampler"])
        data_state = rank_state["data"]
    else:
        module.bank.load_resharded(bank_shard_paths(checkpoint, old_world))
        data_state = dict(read_rank_state(checkpoint, 0)["data"])
        data_state["batch_in_epoch"] = data_state["batch_in_epoch"] * old_world // dist.size()
    data_iter.load_state_dict(data_state)
    return step
