"""What the command-line tools share: their parser, the one-line error exit, a progress bar.

Every tool is `python -m sample_fc.tools.<name>`; a mistake the tool anticipates (a missing
file, a bad value, a model that does not load) ends it with one line
`python -m sample_fc.tools.<name>: error: <message>` and exit code 1, no traceback.
"""
import argparse
import sys
import time


def make_parser(module_name, doc):
    """An ArgumentParser whose usage and errors name the tool as users run it."""
    return argparse.ArgumentParser(prog=f"python -m {module_name}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def expected_errors():
    """The exceptions a tool reports in one line: OSError, ValueError and, when mxnet is
    loaded, MXNetError (not imported here: make_bin and pack need no mxnet to start)."""
    mxnet = sys.modules.get("mxnet")
    return (OSError, ValueError) + ((mxnet.base.MXNetError,) if mxnet is not None else ())


def run_or_exit(parser, work):
    """work() (returns the tool's result); on an expected error print one line, exit 1."""
    try:
        return work()
    except expected_errors() as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")


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
