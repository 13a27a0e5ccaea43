"""Which checkpoint a run resumes from (the files are checkpoint.layout's).

`--resume PATH` names a checkpoint directory or a models root. A models root offers its
complete checkpoints newest first; one that turns out damaged (checkpoint.check_sound: a file
missing, empty, truncated or unreadable) is skipped with a warning and the previous one is
used. A checkpoint named directly must be intact, and one that holds another network is an
error, not a reason to go back further.
"""
from .checkpoint.layout import (OtherNetworkError, check_sound, find_checkpoint, is_complete, list_checkpoints,
                                read_state)


def candidates(path):
    """Checkpoints to try for --resume PATH, in order (FileNotFoundError if there is none)."""
    if is_complete(path):
        return [path]
    find_checkpoint(path)                      # raises, naming PATH, when there is no complete one
    return [checkpoint for _, checkpoint in reversed(list_checkpoints(path))]


def saved_config(path):
    """The config saved with the newest candidate whose state.json reads (see candidates)."""
    problems = []
    for checkpoint in candidates(path):
        try:
            return read_state(checkpoint, needs=("step", "world_size", "config"))["config"]
        except ValueError as err:
            problems.append(str(err))
    raise ValueError(f"--resume {path}: no readable checkpoint ({'; '.join(problems)})")


def choose(path, symbol, image_size, network, warn):
    """The first sound checkpoint of candidates(path) and its state; warn(message) for each
    damaged one skipped. ValueError with every reason when none is usable."""
    tried = candidates(path)
    reasons = []
    for checkpoint in tried:
        try:
            return checkpoint, check_sound(checkpoint, symbol, image_size, network)
        except ValueError as err:
            if len(tried) == 1 or isinstance(err, OtherNetworkError):   # named directly, or another model
                raise
            reasons.append(str(err))
            warn(f"{err}; trying the previous complete checkpoint")
    raise ValueError(f"--resume {path}: no usable checkpoint ({'; '.join(reasons)})")
