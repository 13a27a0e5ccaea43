"""What the command-line tools share: their parser, the one-line error exit, the output check,
the progress lines.

Every tool is `python -m sample_fc.tools.<name>`; a mistake the tool anticipates (a missing
file, a bad value, an undecodable image, a model that does not load, an output folder that
cannot be written) is a UsageError (sample_fc.errors), raised where it is found, and ends the
tool with one line `python -m sample_fc.tools.<name>: error: <message>` and exit code 2
(errors.USAGE_EXIT: argparse's own code for a bad option, and train.py's for a mistake), no
traceback. Any other exception (an OSError or ValueError nobody anticipated: a bug) keeps its
traceback and exits 1. Outputs are checked writable (check_output_folder, check_output_dir)
before any work starts.
"""
import argparse
import os
import sys
import tempfile
import time

from ..errors import USAGE_EXIT, MissingFileError, UsageError


def make_parser(module_name, doc):
    """An ArgumentParser whose usage and errors name the tool as users run it."""
    return argparse.ArgumentParser(prog=f"python -m {module_name}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def run_or_exit(parser, work):
    """work() (returns the tool's result); on a UsageError print one line and exit USAGE_EXIT
    (2). Any other exception propagates with its traceback."""
    try:
        return work()
    except UsageError as err:
        parser.exit(USAGE_EXIT, f"{parser.prog}: error: {err}\n")


def _check_folder_writable(folder, what):
    """UsageError naming `what` unless a file can be created in the existing directory `folder`
    (tried: a read-only mount or a missing permission shows only then)."""
    try:
        handle, probe = tempfile.mkstemp(prefix=".write-test-", dir=folder)
    except OSError as err:
        raise UsageError(f"{what}: cannot write in {folder} ({err.strerror or err})") from None
    os.close(handle)
    os.remove(probe)


def check_output_folder(path, option):
    """Before any work: UsageError naming `option` unless the file `path` can be written — its
    folder exists (MissingFileError otherwise: the tools that write one file do not create
    folders) and takes a new file, and `path` is not a directory."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise MissingFileError(f"{option} {path}: the folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a directory; name the file to write")
    _check_folder_writable(folder, f"{option} {path}")


def check_output_dir(path, option):
    """Before any work: UsageError naming `option` unless the output directory `path` exists and
    takes new files, or can be created (its nearest existing parent is a directory that does)."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{option} {path}: {existing} is a file, not a directory")
    _check_folder_writable(existing, f"{option} {path}")


def _duration(seconds):
    """'42 s', '7m05s', '3h12m'."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Progress of a long loop on stderr, the one reporter of every tool: a line with the count,
    the rate and the time left, at most every `interval` seconds (INTERVAL_S; redrawn in place
    every 0.5 s on a terminal), and a last line with the total time when the count reaches
    `total`. update(n) after each n more items."""

    INTERVAL_S = 10.0

    def __init__(self, total, what, enabled=True, unit="images", interval=None, stream=None,
                 clock=time.monotonic):
        self.total, self.what, self.unit, self.enabled, self.done = total, what, unit, enabled, 0
        self.stream, self.clock = stream or sys.stderr, clock
        self.live = enabled and self.stream.isatty()
        self.interval = interval if interval is not None else (0.5 if self.live else self.INTERVAL_S)
        self.start = self._last = clock()
        self._ended = False

    def line(self):
        """'embedding: 1,200/50,000 images (2%), 85.3 images/s, 9m34s left' (or the final line)."""
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = self.done / elapsed
        if self.done >= self.total:
            return (f"{self.what}: {self.done:,} {self.unit} in {_duration(elapsed)}, "
                    f"{rate:,.1f} {self.unit}/s")
        left = _duration((self.total - self.done) / rate) if rate > 0 else "unknown time"
        return (f"{self.what}: {self.done:,}/{self.total:,} {self.unit} ({100 * self.done // max(self.total, 1)}%), "
                f"{rate:,.1f} {self.unit}/s, {left} left")

    def update(self, n=1):
        self.done += n
        if not self.enabled:
            return
        finished = self.done >= self.total
        now = self.clock()
        if (finished and not self._ended) or (not finished and now - self._last >= self.interval):
            self._last, self._ended = now, finished
            end = "\n" if finished or not self.live else ""
            self.stream.write(("\r\033[K" if self.live else "") + self.line() + end)
            self.stream.flush()
