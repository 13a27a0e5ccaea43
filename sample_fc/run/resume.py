"""Which checkpoint a run resumes from (the files are checkpoint.layout's).

`--resume PATH` names a checkpoint directory or a models root. A models root offers the
complete checkpoints of the run being continued (run_root: a restart's run, else the root's
own), newest first; one that turns out damaged (checkpoint.check_sound: a file
missing, empty, truncated, unreadable or failing its checksum) is skipped with a warning and
the previous one is used. A checkpoint named directly must be intact, and one that holds
another network is an error, not a reason to go back further.

A run saved under a network name that has since changed meaning resumes as the network it
holds (RENAMED_NETWORKS), with a note saying so.
"""
import json

from ..symbols.catalog import RENAMED_NETWORKS
from ..checkpoint.layout import (OtherNetworkError, check_sound, find_checkpoint, is_complete, read_state,
                                 symbol_path, verify_files)
from ..errors import UsageError
from .run_root import checkpoints_of_run


def candidates(path, run_id=None):
    """Checkpoints to try for --resume PATH, in order: PATH itself when it is a checkpoint,
    else the complete checkpoints of run `run_id` (None: any) in the models root PATH, newest
    first. MissingFileError when there is none."""
    if is_complete(path):
        return [path]
    find_checkpoint(path)                      # raises, naming PATH, when there is no complete one
    found = checkpoints_of_run(path, run_id)
    if not found:
        raise UsageError(f"--resume {path}: no complete checkpoint of run {run_id} there (the root's "
                         f"checkpoints belong to other runs)")
    return [checkpoint for _, checkpoint in reversed(found)]


def stem_channels(checkpoint):
    """The output channels of the saved backbone's `stem_conv`, from its symbol JSON (None if
    it has none or the file does not read: check_sound names such a file)."""
    try:
        with open(symbol_path(checkpoint)) as handle:
            nodes = json.load(handle)["nodes"]
        return next((int(node["attrs"]["num_filter"]) for node in nodes if node.get("name") == "stem_conv"), None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def network_now(checkpoint, config, note):
    """`config` with its network under today's name (RENAMED_NETWORKS), note(line) when renamed."""
    name = config.get("network")
    if name in RENAMED_NETWORKS and stem_channels(checkpoint) == RENAMED_NETWORKS[name][0]:
        now = RENAMED_NETWORKS[name][1]
        note(f"{checkpoint} was saved with network {name!r}, which is now called {now!r} ({name!r} is "
             f"now a wider network); resuming it as {now!r}")
        return dict(config, network=now)
    return config


def saved_state(path, run_id=None):
    """(checkpoint, state) of the newest candidate whose state.json reads and matches its
    checksum (see candidates). A damaged state.json is passed over here as choose passes over
    its checkpoint."""
    problems = []
    for checkpoint in candidates(path, run_id):
        try:
            verify_files(checkpoint, files="state")
            return checkpoint, read_state(checkpoint, needs=("step", "world_size", "config"))
        except UsageError as err:
            problems.append(str(err))
    raise UsageError(f"--resume {path}: no readable checkpoint ({'; '.join(problems)})")


def saved_config(path, run_id=None, note=lambda line: None):
    """The config saved_state finds, its network under today's name (network_now; note(line)
    says when it was renamed)."""
    checkpoint, state = saved_state(path, run_id)
    return network_now(checkpoint, state["config"], note)


def choose(path, symbol, image_size, network, warn, run_id=None):
    """The first sound checkpoint of candidates(path, run_id) and its state; warn(message) for
    each damaged one skipped. UsageError with every reason when none is usable."""
    tried = candidates(path, run_id)
    reasons = []
    for checkpoint in tried:
        try:
            return checkpoint, check_sound(checkpoint, symbol, image_size, network)
        except UsageError as err:
            if len(tried) == 1 or isinstance(err, OtherNetworkError):   # named directly, or another model
                raise
            reasons.append(str(err))
            warn(f"{err}; trying the previous complete checkpoint")
    raise UsageError(f"--resume {path}: no usable checkpoint ({'; '.join(reasons)})")
