"""The on-disk layout of a training checkpoint: every file name, its estimated size, the
COMPLETE test, and reading and checking a checkpoint (param_differences: saved backbone
parameters against a network), with no Horovod (the tools and resume use this as is).

One checkpoint, `<models_root>/step-00000300/`:
    model-symbol.json, model-0300.params   backbone, loadable by mx.model.load_checkpoint
    optimizer.params                        backbone optimizer state (momentum), MXNet's
                                            NDArray format: restoring never unpickles
    bank-rank<r>.json, bank-rank<r>.weight.npy, bank-rank<r>.momentum.npy
                                            every rank's bank shard (bank_shard.py: its metadata,
                                            weight and momentum rows; runs saved before wrote one
                                            MXNet file bank-rank<r>.params, still read); with
                                            bank_momentum=int8 the momentum file holds int8 codes
                                            and bank-rank<r>.momentum_scale.npy their scales; with
                                            none there is no momentum file
    rank<r>.json                            every rank's sampler RNG and data position
    aux-rank<r>.params                      every rank's own BatchNorm statistics (the model
                                            holds their average over ranks)
    state.json                              step, world size, class count, embedding size, config,
                                            the Partial FC layer's options (partial_fc)
    COMPLETE                                written last: {"step": N, "files": {name: {"bytes": n,
                                            "xxh3_64": hex}}}, every other file's size and checksum,
                                            taken as it was written (checksums.py); empty or
                                            {"step": N} in checkpoints saved before
It is written as `step-00000300.partial/` and renamed once COMPLETE is in it (save_restore.py),
so a directory named step-XXXXXXXX with a COMPLETE file is a finished checkpoint; nothing
else is ever read as one. Whatever reads one checks its files against COMPLETE first
(verify_files): resume every file, the tools the backbone's.
"""
import json
import os
import re

import mxnet as mx

from .bank_shard import SavedRows
from ..errors import MissingFileError, UsageError
from ..pfc.row_storage import ROW_ARRAYS, Storage
from ..pfc.sampler import shard_range
from .checksums import first_difference
from .legacy import check_ndarray_files, check_rank_states, check_symbol_file, loader_reason

PATTERN = re.compile(r"^step-(\d{8})$")
MODEL_PREFIX = "model"
OPTIMIZER_FILE = "optimizer.params"
STATE_FILE = "state.json"
COMPLETE_FILE = "COMPLETE"
PARTIAL_SUFFIX = ".partial"


class OtherNetworkError(UsageError):
    """The checkpoint is sound but holds another network than the run builds."""


# ---- names ---------------------------------------------------------------------------------
def checkpoint_path(models_root, step):
    return os.path.join(models_root, f"step-{step:08d}")


def model_prefix(checkpoint):
    """The prefix for mx.model.load_checkpoint(prefix, step) inside a checkpoint."""
    return os.path.join(checkpoint, MODEL_PREFIX)


def params_path(checkpoint, step):
    return f"{model_prefix(checkpoint)}-{step:04d}.params"


def symbol_path(checkpoint):
    return model_prefix(checkpoint) + "-symbol.json"


def optimizer_path(checkpoint):
    return os.path.join(checkpoint, OPTIMIZER_FILE)


def state_path(checkpoint):
    return os.path.join(checkpoint, STATE_FILE)


def complete_path(checkpoint):
    return os.path.join(checkpoint, COMPLETE_FILE)


def bank_shard_files(checkpoint, rank):
    """The files of rank `rank`'s bank shard (bank_shard.py): {"meta", "weight", "weight_scale",
    "momentum", "momentum_scale"} (which row files a shard has: row_storage.Storage.arrays), and
    "legacy", the one file of runs saved before."""
    base = os.path.join(checkpoint, f"bank-rank{rank}")
    return {"meta": base + ".json", **{name: f"{base}.{name}.npy" for name in ROW_ARRAYS}, "legacy": base + ".params"}


def rank_state_path(checkpoint, rank):
    return os.path.join(checkpoint, f"rank{rank}.json")


def aux_path(checkpoint, rank):
    return os.path.join(checkpoint, f"aux-rank{rank}.params")


def checkpoint_bytes(backbone_values, num_classes, embedding_size, storage=Storage()):
    """Estimated size of one checkpoint: the backbone's parameters and their momentum (float32),
    and every class center with its momentum as stored (all ranks' shards: Storage.row_bytes),
    plus 1 MB of small files."""
    return 8 * backbone_values + num_classes * storage.row_bytes(embedding_size) + 2 ** 20


# ---- finding -------------------------------------------------------------------------------
def is_complete(path):
    """Whether `path` is a finished checkpoint directory (it holds COMPLETE)."""
    return os.path.isfile(complete_path(path))


def list_checkpoints(models_root):
    """[(step, path)] of complete checkpoints, oldest first."""
    if not os.path.isdir(models_root):
        return []
    found = []
    for name in os.listdir(models_root):
        match = PATTERN.match(name)
        path = os.path.join(models_root, name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def find_checkpoint(path, step=None, option="--resume"):
    """A complete checkpoint directory: `path` itself when it is one (and step is None), else
    the newest complete checkpoint under the models root `path`, or the one of `step`.
    MissingFileError (a UsageError) names `option`."""
    if step is None and is_complete(path):
        return path
    found = dict(list_checkpoints(path))
    if not found:
        raise MissingFileError(f"{option} {path}: no complete checkpoint (step-XXXXXXXX/ with a "
                                f"{COMPLETE_FILE} file) there")
    if step is None:
        return found[max(found)]
    if step not in found:
        raise MissingFileError(f"{option} {path},{step}: no complete checkpoint step-{step:08d}/ "
                                f"there (complete: {', '.join(map(str, sorted(found)))})")
    return found[step]


def previous_checkpoint(path):
    """(step, path) of the newest complete checkpoint older than the checkpoint directory
    `path` in its models root, or None (`path` is no step-XXXXXXXX/ directory, or the oldest)."""
    match = PATTERN.match(os.path.basename(os.path.normpath(path)))
    if not match:
        return None
    older = [(step, other) for step, other in list_checkpoints(os.path.dirname(os.path.abspath(path)))
             if step < int(match.group(1))]
    return older[-1] if older else None


def models_root_of(path):
    """The models root a checkpoint or models-root `path` belongs to."""
    return os.path.dirname(os.path.abspath(path)) if is_complete(path) else path


# ---- reading -------------------------------------------------------------------------------
def _read_json(path):
    with open(path) as handle:
        return json.load(handle)


def read_state(checkpoint, needs=("step", "world_size")):
    """state.json of a checkpoint, holding the keys `needs` (UsageError naming the file when
    it cannot be read or lacks one)."""
    try:
        state = _read_json(state_path(checkpoint))
    except (OSError, ValueError) as err:
        raise UsageError(f"checkpoint {checkpoint}: {STATE_FILE} cannot be read ({err})") from None
    if not isinstance(state, dict) or not set(needs) <= set(state):
        raise UsageError(f"checkpoint {checkpoint}: {STATE_FILE} lacks {' or '.join(needs)}")
    return state


def read_rank_state(checkpoint, rank):
    """rank<r>.json: {"sampler": ..., "data": ...} of that rank."""
    return _read_json(rank_state_path(checkpoint, rank))


def _check_shard_size(checkpoint, files, num_local, embedding_size, arrays):
    """UsageError when a saved bank shard is shorter than its rows need (a truncated file);
    `arrays`: the shard's row files, as row_storage.shard_arrays names them."""
    if os.path.isfile(files["legacy"]):                # weight + momentum of float32, and a header
        sound = {files["legacy"]: os.path.getsize(files["legacy"]) >= 2 * 4 * num_local * embedding_size}
    else:
        sound = {}
        for name, (_, columns) in arrays.items():
            path = files[name]
            try:
                sound[path] = SavedRows(path).shape == (num_local, columns)
            except (OSError, ValueError):          # shorter than its header says, or no header
                sound[path] = False
    for path, ok in sound.items():
        if not ok:
            raise UsageError(f"checkpoint {checkpoint} is damaged: {os.path.basename(path)} is truncated "
                             f"({os.path.getsize(path)} bytes for {num_local} classes)")


def read_complete(checkpoint):
    """COMPLETE's record, {"step": N, "files": {name: {"bytes", "xxh3_64"}}}, or {} (an empty
    COMPLETE of a checkpoint saved before {"step": N}); UsageError when it does not read."""
    try:
        with open(complete_path(checkpoint), "rb") as handle:
            text = handle.read()
        record = json.loads(text) if text.strip() else {}
    except (OSError, ValueError) as err:
        raise UsageError(f"checkpoint {checkpoint} is damaged: {COMPLETE_FILE} cannot be read ({err})") from None
    files = record.get("files", {}) if isinstance(record, dict) else None
    if not isinstance(files, dict) or not all(isinstance(entry, dict) for entry in files.values()):
        raise UsageError(f"checkpoint {checkpoint} is damaged: {COMPLETE_FILE} holds no file record")
    return record


def _is_backbone_file(name):
    return name.startswith(MODEL_PREFIX + "-") or name == STATE_FILE


VERIFIED_FILES = {"all": lambda name: True,              # a resume
                  "backbone": _is_backbone_file,         # the tools: model-*, state.json
                  "state": lambda name: name == STATE_FILE}   # the config a resume starts from


def verify_files(checkpoint, files="all"):
    """UsageError `checkpoint <dir> is damaged: <file> <what>` when a file COMPLETE records is
    missing, has another size or fails its checksum (checksums.first_difference); `files`: which
    of them (VERIFIED_FILES). A checkpoint saved before checksums (COMPLETE without "files") has
    its symbol JSON parsed instead (unless files is "state"). A directory without COMPLETE (a plain
    MXNet model's folder) has nothing to verify."""
    if not is_complete(checkpoint):
        return
    recorded = read_complete(checkpoint).get("files")
    if recorded is None:
        if files != "state":
            _check_symbol_reads(checkpoint)
        return
    wanted = VERIFIED_FILES[files]
    difference = first_difference(checkpoint, {name: entry for name, entry in recorded.items() if wanted(name)})
    if difference:
        raise UsageError(f"checkpoint {checkpoint} is damaged: {' '.join(difference)}")


def _check_symbol_reads(checkpoint):
    """UsageError naming model-symbol.json when it is no graph MXNet parses (when it exists)."""
    path = symbol_path(checkpoint)
    if os.path.isfile(path):
        check_symbol_file(checkpoint, path)


def saved_before_checksums(checkpoint):
    """Whether the complete checkpoint's COMPLETE records no files (runs saved before checksums)."""
    return read_complete(checkpoint).get("files") is None


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


def check_sound(checkpoint, symbol, image_size, network):
    """The checkpoint's state (with its config) when everything a restore reads is there and
    sound: UsageError naming the missing, empty, truncated, unreadable or changed file (its
    checksum: verify_files, first), or how the checkpoint's backbone differs from this run's
    (`symbol` of `network`). Restoring then never meets a missing file (MXNet can crash on one),
    damaged bytes or a shape it cannot load."""
    verify_files(checkpoint)
    state = read_state(checkpoint, needs=("step", "world_size", "config"))
    step, world, saved = state["step"], state["world_size"], state["config"]
    params = params_path(checkpoint, step)
    ranks = [rank_state_path(checkpoint, r) for r in range(world)]
    shards = [bank_shard_files(checkpoint, r) for r in range(world)]
    # the row files of the run's bank (runs saved before bank_momentum stored it as the weights)
    arrays = Storage.from_meta(saved).arrays(saved["embedding_size"])
    shard_files = [path for files in shards for path in
                   ([files["legacy"]] if os.path.isfile(files["legacy"])
                    else [files["meta"]] + [files[name] for name in arrays])]
    for path in [symbol_path(checkpoint), params, optimizer_path(checkpoint)] + shard_files + ranks + \
            [aux_path(checkpoint, r) for r in range(world)]:
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            raise UsageError(f"checkpoint {checkpoint} is damaged: {os.path.basename(path)} is missing or empty")
    check_rank_states(checkpoint, ranks)
    if saved_before_checksums(checkpoint):     # no checksums: MXNet's files checked before MXNet reads them
        check_ndarray_files(checkpoint, [params, optimizer_path(checkpoint)] +
                            [aux_path(checkpoint, r) for r in range(world)] +
                            [files["legacy"] for files in shards if os.path.isfile(files["legacy"])])
    for rank, files in enumerate(shards):
        _check_shard_size(checkpoint, files, shard_range(saved["num_classes"], rank, world)[1], saved["embedding_size"],
                          arrays)
    try:
        loaded = mx.nd.load(params)
    except (mx.base.MXNetError, UnicodeDecodeError) as err:
        raise UsageError(f"checkpoint {checkpoint} is damaged: {os.path.basename(params)} cannot be read "
                         f"({loader_reason(err)})") from None
    differences = param_differences(loaded, symbol, image_size)
    if differences:
        raise OtherNetworkError(f"checkpoint {checkpoint} holds network {saved.get('network')!r} and this run builds "
                         f"{network!r}: {differences[0]} ({len(differences)} differences)")
    return state
