"""The one error type for a mistake the user can fix, and how it is reported.

A check that knows the input is wrong (the config, the data, a checkpoint, the world size, the
models root) raises UsageError with a message naming the bad value and the way out; train.py
prints ERROR_PREFIX + the message once and exits with USAGE_EXIT, and the restart supervisor
does not retry it. Any other exception is a failure of the run or a bug: it keeps its
traceback and exits with FAILURE_EXIT, which the supervisor may retry. The tools exit with
the same USAGE_EXIT for a UsageError (tools/cli.py run_or_exit), as argparse does for a bad
option: 2 means "the input is wrong" for every command of the project.
"""
ERROR_PREFIX = "train.py: error: "
USAGE_EXIT, FAILURE_EXIT = 2, 1


class UsageError(ValueError):
    """A mistake in what the user gave: config, data, checkpoint, world size or models root."""


class MissingFileError(UsageError, FileNotFoundError):
    """A file or directory the user named does not exist (a UsageError and a FileNotFoundError)."""


def mxnet_reason(error):
    """The line of an MXNetError that says what went wrong: its last (MXNet puts its C++
    traceback first), without the 'MXNetError: ' prefix."""
    return str(error).strip().splitlines()[-1].replace("MXNetError: ", "")
