"""Saving and restoring training checkpoints (the layout is layout.py's): complete-or-absent
directories, the last K kept.

Every rank writes into `step-XXXXXXXX.partial`, taking each file's checksum as it writes it
(checksums.py); after the ranks agree, rank 0 writes COMPLETE with every rank's checksums and
renames the directory, so a kill at any point leaves either the finished checkpoint or a
`.partial` directory that nothing reads. For multi-node jobs `models_root` must be on a
filesystem every node sees. Saving and restoring are collectives (they import sample_fc.dist
when called).
"""
import json
import logging
import os
import shutil

import mxnet as mx

from ..config import write_json
from ..errors import UsageError, mxnet_reason
from .bank_shard import restore_resharded, restore_shard, write_shard
from . import checksums
from .layout import (COMPLETE_FILE, PARTIAL_SUFFIX, STATE_FILE, aux_path, bank_shard_files, checkpoint_bytes,
                     checkpoint_path, complete_path, is_complete, list_checkpoints, model_prefix, optimizer_path,
                     params_path, rank_state_path, read_rank_state, read_state, state_path, symbol_path,
                     verify_files)
from .legacy import data_state, loader_reason


def _updater(module):
    updater = module.backbone._updater     # None when the kvstore updates (several devices)
    if updater is None:
        raise ValueError("saving optimizer state needs the backbone updated by its own updater "
                         "(one context per rank)")
    return updater


def save_optimizer_states(module, path):
    """The backbone optimizer's state per parameter index (an NDArray, a tuple of them, or
    None) in MXNet's NDArray format, keyed "<index>.<part>.<parts>"; MXNet's own
    save_optimizer_states pickles, and a pickle runs code when loaded."""
    arrays = {}
    for index, state in _updater(module).states.items():
        parts = () if state is None else tuple(state) if isinstance(state, (tuple, list)) else (state,)
        for k, part in enumerate(parts):
            arrays[f"{index}.{k}.{len(parts)}"] = part
    mx.nd.save(path, arrays)


def load_ndarrays(path, what):
    """mx.nd.load(path); UsageError `cannot read <what> <path>: <reason>` when MXNet cannot (its
    error, or its message not UTF-8). layout.check_sound checks the files first; this is the
    second line."""
    try:
        return mx.nd.load(path)
    except (mx.base.MXNetError, UnicodeDecodeError) as err:
        raise UsageError(f"cannot read {what} {path}: {loader_reason(err)}") from None


def load_optimizer_states(module, path):
    """Restore what save_optimizer_states wrote (missing indices: no state, as at the start)."""
    saved = load_ndarrays(path, "optimizer state")
    parts = {}
    for key, array in (saved.items() if isinstance(saved, dict) else ()):
        index, k, count = (int(x) for x in key.split("."))
        parts.setdefault(index, [None] * count)[k] = array
    updater = _updater(module)
    updater.states = {index: arrays[0] if len(arrays) == 1 else tuple(arrays)
                      for index, arrays in parts.items()}
    updater.states_synced = dict.fromkeys(updater.states, False)   # moved to the weights' devices on use


def _read_back(*paths):
    """{file name: checksum entry} of files MXNet has just written (mx.nd.save,
    mx.model.save_checkpoint: their bytes cannot be seen as they go), read back while they are
    still in the page cache."""
    return {os.path.basename(path): checksums.sum_of_file(path) for path in paths}


def _shard_checksums(files):
    """{file name: checksum entry} of a bank shard write_shard has just written: its row files'
    entries, which it recorded in its metadata as it wrote them, and the metadata file's own
    (a few hundred bytes, read back)."""
    with open(files["meta"]) as handle:
        recorded = json.load(handle)["checksums"]
    sums = {os.path.basename(files[name]): entry for name, entry in recorded.items()}
    sums.update(_read_back(files["meta"]))
    return sums


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def damaged_name(final):
    """The first free `<final>.damaged`, `<final>.damaged-2`, ...: where a damaged checkpoint goes
    aside (layout.PATTERN does not match it, so it is never read as a checkpoint)."""
    path, number = final + ".damaged", 1
    while os.path.lexists(path):
        number += 1
        path = f"{final}.damaged-{number}"
    return path


def _sound_problem(path):
    """Why the existing directory `path` is no sound checkpoint (not complete, or verify_files
    fails), or None."""
    if not is_complete(path):
        return f"it has no {COMPLETE_FILE}"
    try:
        verify_files(path)
    except UsageError as err:
        return str(err)
    return None


def _replace_or_move_aside(final):
    """Clear the place of checkpoint `final` for a new one of the same step: a sound one (re-saved
    after a resume) is removed; anything else there is the user's and is moved aside, in one log
    line."""
    problem = _sound_problem(final)
    if problem is None:
        shutil.rmtree(final)
        return
    aside = damaged_name(final)
    os.rename(final, aside)
    logging.getLogger("sample_fc").warning(f"{final} was no sound checkpoint ({problem}): moved it to {aside} "
                                           f"before saving this step")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (e.g. the disk is full). Its partial directory has
    been removed and the previous complete checkpoint is intact."""


def free_bytes(path):
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def _space_note(models_root, needed):
    return (f"a checkpoint needs about {needed / 1e6:,.0f} MB and {free_bytes(models_root) / 1e6:,.0f} MB "
            f"are free at {models_root}")


def check_space(models_root, needed):
    """UsageError when the file system of models_root cannot hold one checkpoint of `needed`
    bytes: a run that could never save stops at start-up, not at its first checkpoint."""
    if free_bytes(models_root) < needed:
        raise UsageError(f"not enough space for checkpoints: {_space_note(models_root, needed)}; "
                         f"free some space or choose another --models-root")


def save_checkpoint(models_root, step, module, symbol, data_iter, train_state, keep):
    """Write checkpoint `step`. Every rank must call it (the ranks agree after each stage).

    train_state: JSON-able dict, the same on all ranks (written by rank 0 to state.json).
    Each rank writes its sampler's RNG and data_iter's position (rank<r>.json).
    keep: number of complete checkpoints to keep (older ones are deleted).
    A write that fails on any rank (OSError: a full disk, a lost mount) raises CheckpointError
    on every rank, with the partial directory removed and the previous checkpoint intact.
    """
    from .. import dist
    rank = dist.rank()
    final = checkpoint_path(models_root, step)
    partial = final + PARTIAL_SUFFIX
    arg_params, aux_params = module.get_export_params()        # collective

    def agree(stage, work):
        """Run this rank's `work`; then every rank learns whether all of them succeeded, and
        gets every rank's result (in rank order). MXNet's writers raise MXNetError."""
        _, problems, results = dist.agree(work, f"checkpoint.{step}.{stage}", (OSError, mx.base.MXNetError),
                                          lambda error: f"rank {rank}: {mxnet_reason(error)}", share_results=True)
        problems = [p for p in problems if p]
        if problems:
            if rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            values = sum(v.size for v in list(arg_params.values()) + list(aux_params.values()))
            bank = module.partial_fc.bank
            needed = checkpoint_bytes(values, bank.num_classes, bank.embedding_size, bank.storage)
            previous = list_checkpoints(models_root)
            raise CheckpointError(f"cannot write checkpoint {final} ({problems[0]}); "
                                  f"{_space_note(models_root, needed)}; the partial checkpoint was "
                                  f"removed, the last complete one is "
                                  f"{previous[-1][1] if previous else 'none'}")
        return results

    def begin():
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)

    def write_files():
        """This rank's files, written; {file name: checksum entry} of each."""
        shard, aux, own_state = bank_shard_files(partial, rank), aux_path(partial, rank), rank_state_path(partial, rank)
        write_shard(module.partial_fc.bank, shard)
        mx.nd.save(aux, module.get_params()[1])
        sums = {**_shard_checksums(shard), **_read_back(aux)}
        sums[os.path.basename(own_state)] = checksums.write_json(
            own_state, {**module.partial_fc.state_dict(), "data": data_iter.state_dict()})
        if rank == 0:
            mx.model.save_checkpoint(model_prefix(partial), step, symbol, arg_params, aux_params,
                                     remove_amp_cast=False)
            save_optimizer_states(module, optimizer_path(partial))
            sums.update(_read_back(symbol_path(partial), params_path(partial, step), optimizer_path(partial)))
            sums[STATE_FILE] = checksums.write_json(state_path(partial), dict(train_state, step=step))
        return sums

    def finish(every_ranks_sums):
        if rank == 0:
            files = {name: entry for sums in every_ranks_sums for name, entry in sums.items()}
            write_json(complete_path(partial), {"step": step, "files": files})
            _fsync_dir(partial)
            if os.path.exists(final):            # re-saving a step, e.g. after resume
                _replace_or_move_aside(final)
            os.rename(partial, final)
            _fsync_dir(models_root)
            for _, old in list_checkpoints(models_root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)

    agree("begin", begin)
    every_ranks_sums = agree("written", write_files)
    agree("done", lambda: finish(every_ranks_sums))
    return final


def compatible_state(checkpoint, num_classes, embedding_size):
    """The checkpoint's state.json, checked against this run's num_classes and
    embedding_size (UsageError naming the key and both values)."""
    state = read_state(checkpoint)
    for key, want in (("num_classes", num_classes), ("embedding_size", embedding_size)):
        if state.get(key) != want:
            raise UsageError(f"checkpoint {checkpoint} was trained with {key}={state.get(key)}, "
                             f"this run has {key}={want}")
    return state


def restore_checkpoint(checkpoint, module, data_iter, num_classes, embedding_size, say=None):
    """Load a checkpoint into a built module (and data iterator); returns its step. The bank's
    rows are read with the ranks kept in step (dist.Pace; `say`: rank 0's progress lines).

    Same world size: everything continues exactly (bank shard, sampler RNG, data position,
    each rank's own BatchNorm statistics), bit for bit.
    Different world size: the bank is re-split from all old shards, and the data continues at
    the same image of the same epoch (the global batches are the epoch's images in order,
    whatever the world size: data/iterators.py).
    """
    from .. import dist
    state = compatible_state(checkpoint, num_classes, embedding_size)
    step, old_world, rank = state["step"], state["world_size"], dist.rank()
    _, arg_params, aux_params = mx.model.load_checkpoint(model_prefix(checkpoint), step)
    if old_world == dist.size():          # this rank's own statistics, not the ranks' average
        aux_params = load_ndarrays(aux_path(checkpoint, rank), "BatchNorm statistics")
    module.set_params(arg_params, aux_params)
    load_optimizer_states(module, optimizer_path(checkpoint))
    module.set_num_update(step)
    bank = module.partial_fc.bank
    pace = dist.Pace("reading the checkpoint's class centers", bank.num_local, say)
    first_rank = read_rank_state(checkpoint, 0)        # the margin's state is the same on every rank
    layer_state = {"margin": first_rank.get("margin", {})}
    if old_world == dist.size():
        restore_shard(bank, bank_shard_files(checkpoint, rank), pace)
        own = first_rank if rank == 0 else read_rank_state(checkpoint, rank)
        layer_state["sampler"] = own["sampler"]                                   # this rank's own RNG
    else:
        restore_resharded(bank, [bank_shard_files(checkpoint, r) for r in range(old_world)], pace)
    pace.finish()                         # before the next collective: every rank holds all its meetings
    module.partial_fc.load_state_dict(layer_state)
    data_iter.load_state_dict(data_state(first_rank["data"], old_world, data_iter.batch_size))
    return step
