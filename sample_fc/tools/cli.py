"""What the command-line tools share: their parser, the one-line error exit, a progress bar.

Every tool is `python -m sample_fc.tools.<name>`; a mistake the tool anticipates (a missing
file, a bad value, an undecodable image, a model that does not load) is a UsageError
(sample_fc.errors), raised where it is found, and ends the tool with one line
`python -m sample_fc.tools.<name>: error: <message>` and exit code 1, no traceback. Any
other exception (an OSError or ValueError nobody anticipated: a bug) keeps its traceback.
"""
import argparse
import os
import sys
import time

from ..errors import MissingFileError, UsageError


def make_parser(module_name, doc):
    """An ArgumentParser whose usage and errors name the tool as users run it."""
    return argparse.ArgumentParser(prog=f"python -m {module_name}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def run_or_exit(parser, work):
    """work() (returns the tool's result); on a UsageError print one line and exit 1. Any
    other exception propagates with its traceback."""
    try:
        return work()
    except UsageError as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")


def check_output_folder(path, option):
    """MissingFileError naming `option` when the folder that would hold the file `path` does
    not exist (the tools that write one file do not create folders)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise MissingFileError(f"{option} {path}: the folder {folder} does not exist")


class Progress:
    """A one-line progress bar on stderr, redrawn at most every 0.2 s (only the end if not a tty)."""

    def __init__(self, total, what, enabled=True):
        self.total, self.what, self.enabled, self.done, self._last = total, what, enabled, 0, 0.0
        self.live = enabled and sys.stderr.isatty()

    def update(self, n=1):
        self.done += n
        now = time.monotonic()
        if (self.live and now - self._last > 0.2) or (self.enabled and self.done >= self.total):
            self._last = now
            filled = int(30 * self.done / max(self.total, 1))
            bar = "#" * filled + "." * (30 - filled)
            sys.stderr.write(f"\r{self.what} [{bar}] {self.done}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
