"""Checks of a checkpoint's files by their structure, for what checksums do not cover: a checkpoint
saved before checksums (COMPLETE empty or {"step": N}) has nothing to compare its bytes with, so
its MXNet files are checked as MXNet reads them (data/mxnet_files.py) before MXNet does (a damaged
one can crash MXNet's loaders, or make their error message undecodable), and every checkpoint's
rank<r>.json must hold what a restore reads. Each check raises the UsageError
`checkpoint <dir> is damaged: <file> ...` that lets a resume fall back (layout.check_sound).
"""
import json
import os

import mxnet as mx
import numpy as np

from ..data.mxnet_files import ndarray_file_problem, symbol_file_problem
from ..data.iterators import DATA_STATE_KEYS as ITERATOR_STATE_KEYS
from ..errors import UsageError, mxnet_reason

DATA_STATE_KEYS = set(ITERATOR_STATE_KEYS)         # what the iterators' load_state_dict takes
OLD_DATA_STATE_KEYS = {"epoch", "batch_in_epoch", "seed"}   # before 2026-11-29: counted in batches of the old world


def loader_reason(error):
    """The one line of why an MXNet loader failed: its MXNetError's reason, or, when MXNet's
    message was not UTF-8 (a UnicodeDecodeError in its error path), that."""
    return mxnet_reason(error) if isinstance(error, mx.base.MXNetError) else "MXNet's message is not UTF-8"


def _damaged(checkpoint, path, what):
    return UsageError(f"checkpoint {checkpoint} is damaged: {os.path.basename(path)} {what}")


def check_symbol_file(checkpoint, path):
    """UsageError naming the symbol JSON `path` unless it is a graph MXNet parses."""
    problem = symbol_file_problem(path)
    if problem:
        raise _damaged(checkpoint, path, f"cannot be read ({problem})")
    try:
        mx.sym.load(path)
    except (mx.base.MXNetError, UnicodeDecodeError) as err:
        raise _damaged(checkpoint, path, f"cannot be read ({loader_reason(err)})") from None


def check_ndarray_files(checkpoint, paths):
    """UsageError naming the first of `paths` not laid out as MXNet's NDArray file format."""
    for path in paths:
        problem = ndarray_file_problem(path)
        if problem:
            raise _damaged(checkpoint, path, f"cannot be read ({problem})")


def _rank_state_problem(state):
    """What rank<r>.json's content lacks for a restore, or None."""
    if not isinstance(state, dict) or not {"sampler", "data"} <= set(state):
        return "holds no sampler and data state"
    sampler, data = state["sampler"], state["data"]
    if not isinstance(sampler, dict) or "bit_generator" not in sampler:
        return "holds no sampler generator state"
    try:
        np.random.default_rng().bit_generator.state = sampler["bit_generator"]   # the sampler's kind (PCG64)
    except (TypeError, ValueError, KeyError) as err:
        return f"holds a sampler state that is not a generator's ({err})"
    if not isinstance(data, dict) or set(data) not in (DATA_STATE_KEYS, OLD_DATA_STATE_KEYS):
        return f"holds a data state without the keys {', '.join(sorted(DATA_STATE_KEYS))}"
    position = "image_in_epoch" if "image_in_epoch" in data else "batch_in_epoch"
    if not all(type(data[key]) is int and data[key] >= 0 for key in ("epoch", position)):
        return f"holds a data position that is not two counts ({data['epoch']!r}, {data[position]!r})"
    return None


def data_state(saved, old_world, batch_size):
    """An iterator's state (DATA_STATE_KEYS) from a rank<r>.json's data state: as it is, or, from
    a checkpoint saved before positions were counted in images, its batch count times the old
    global batch (old_world x batch_size; the run's batch_size cannot change on resume). Such a
    run continues at the same place in its epoch, in the current order of the epoch's images."""
    if set(saved) == OLD_DATA_STATE_KEYS:
        return {"epoch": saved["epoch"], "image_in_epoch": saved["batch_in_epoch"] * old_world * batch_size,
                "seed": saved["seed"]}
    return dict(saved)


def check_rank_states(checkpoint, paths):
    """UsageError naming the first rank<r>.json of `paths` that does not read as JSON or does not
    hold {"sampler": {"bit_generator": ...}, "data": {"epoch", "image_in_epoch", "seed"}} (or the
    older data state counted in batches)."""
    for path in paths:
        try:
            with open(path) as handle:
                state = json.load(handle)
        except (OSError, ValueError) as err:
            raise _damaged(checkpoint, path, f"({err})") from None
        problem = _rank_state_problem(state)
        if problem:
            raise _damaged(checkpoint, path, problem)
