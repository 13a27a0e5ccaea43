"""A stop asked for by a signal: the scheduler's SIGTERM, a terminal's SIGINT, SLURM's warning.

The first signal only records the request (StopSignals.requested); the training loop carries it
to every rank in the step's existing small allreduce (module.py, send_flags), so all ranks stop
after the same step, and the run ends with a checkpoint of that step (train.py). A second
signal, or a stop that takes longer than `grace_s`, ends the process at once through `abort`
(no new checkpoint: a partial one is never read, the previous complete one stays).
"""
import signal
import threading
import time

from ..options import signal_number

STOP_EXIT_BASE = 128                    # a stopped job exits with 128 + the signal's number
SAME_STOP_S = 2.0                       # a signal this soon after the first is the same stop, passed on
                                        # (a scheduler signals every process, and mpirun forwards it too)


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class StopSignals:
    """Handlers for `names` (e.g. ("SIGTERM", "SIGINT", "SIGUSR1")) in this process.

    requested: the number of the first signal received, 0 before any. From the first signal on,
    a timer gives the stop `grace_s` seconds; then, or at a second signal (SAME_STOP_S or more
    after the first: one sooner is the same stop reaching this process twice), `abort(signal
    number, reason)` runs on the thread that noticed it and must end the process (os._exit).
    `on_abort` replaces it once the run has more to record (RunEvents.abort).
    """

    def __init__(self, names, abort, grace_s=25.0, clock=time.monotonic):
        self.numbers = [signal_number(name) for name in names]
        self.abort, self.grace_s, self.clock = abort, grace_s, clock
        self.requested, self.requested_at = 0, None
        self._timer = None
        self._previous = {}


    def on_abort(self, abort):
        """From now on `abort(number, reason)` ends the process when a stop cannot finish."""
        self.abort = abort
    def install(self):
        """Take over the signals (main thread only); returns self."""
        for number in self.numbers:
            self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def uninstall(self):
        """Give the signals back to their previous handlers and cancel the grace timer."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._timer is not None:
            self._timer.cancel()

    def finished(self):
        """The stop is done (its checkpoint written): no grace timer any more; a second signal
        still ends the process at once."""
        if self._timer is not None:
            self._timer.cancel()

    def _on_signal(self, number, frame):
        if self.requested:
            if self.clock() - self.requested_at >= SAME_STOP_S:
                self.abort(number, f"a second signal ({signal_name(number)}) during the stop")
            return
        self.requested, self.requested_at = number, self.clock()
        self._timer = threading.Timer(self.grace_s, self.abort,
                                      (number, f"the stop took longer than stop_grace_s={self.grace_s:g} s"))
        self._timer.daemon = True
        self._timer.start()
