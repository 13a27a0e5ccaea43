"""StepWatchdog: end this rank when no training step has finished for too long.

Horovod's stall check sees a rank missing from a collective the others joined; it cannot see
a job where every rank is stuck outside a collective (all data readers on a dead file
system, say). The watchdog can: a thread that ends the process with one line naming the
rank, the step and the stage it was in (the module's stage hook: data, forward, allgather,
..., gradient_sum, bank_update, backbone_update; checkpoint, verification) when no step has finished
for the timeout, so the launcher sees a failure (and, with restarts on, restarts the job from its
last checkpoint).

The timeout is `timeout_s` when > 0; with 0 it is set after `warmup_steps` steps to
max(min_auto_s, 10 x the median step time of the next 10 steps). Either way it is armed
only after the first `warmup_steps` steps (start-up, first MXNet graph builds). A long
legitimate stage (a checkpoint, a verification) calls progress() when it ends, so the next
step is timed from there.

Its thread wakes every few seconds; a wake-up that comes much later than asked means this
process did not run in between (stopped by a signal, swapped out, starved of CPU): `paused_s`
says for how long, which a rank whose peers gave up on it names in its error line.
"""
import contextlib
import os
import statistics
import sys
import threading
import time

from ..errors import ERROR_PREFIX

AUTO_FACTOR, AUTO_STEPS, MIN_AUTO_S = 10, 10, 300.0


class StepWatchdog:
    def __init__(self, timeout_s, rank, warmup_steps=3, min_auto_s=MIN_AUTO_S, exit_code=1,
                 poll_s=None, clock=time.monotonic, on_timeout=None):
        if timeout_s < 0:
            raise ValueError(f"step_timeout_s must be >= 0 (0 = automatic), got {timeout_s}")
        self.rank, self.warmup_steps, self.min_auto_s = rank, warmup_steps, min_auto_s
        self.timeout_s = float(timeout_s) or None        # None until measured (automatic)
        self.fixed = timeout_s > 0
        self.clock, self.exit_code = clock, exit_code
        self.on_timeout = on_timeout or self._end_process
        self.step, self.stage_name, self.steps_seen = 0, "at start", 0
        self.last_progress = clock()
        self._durations = []
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread = None
        self._tick, self._longest_pause = clock(), 0.0

    # ---- what the training loop reports ----------------------------------------------
    def stage(self, name):
        """The stage this rank is in now (named in the timeout message); a stage hook, as
        SampleDistributeModule.connect(stage_hook=...): returns a context manager for the stage's block."""
        self.stage_name = name
        return contextlib.nullcontext()

    def step_done(self, step, seconds):
        """A step finished (1-based `step`, its wall time)."""
        self.step, self.steps_seen = step, self.steps_seen + 1
        self.last_progress = self.clock()
        if not self.fixed and self.steps_seen > self.warmup_steps and len(self._durations) < AUTO_STEPS:
            self._durations.append(seconds)
            if len(self._durations) == AUTO_STEPS:
                self.timeout_s = max(self.min_auto_s, AUTO_FACTOR * statistics.median(self._durations))

    def where(self):
        """What this rank is doing, in words (its error lines name it)."""
        if self.stage_name.startswith("at start"):
            return self.stage_name
        return f"step {self.step + 1}, stage {self.stage_name}"

    def paused_s(self):
        """The longest time this process did not run while the watchdog watched (0 when its
        thread always woke about when it asked), counting a pause still going on as seen now."""
        current = self.clock() - self._tick - self._interval()
        return max(self._longest_pause, current if self._thread is not None else 0.0, 0.0)

    def progress(self):
        """Something legitimate and long just completed (e.g. a checkpoint): restart the clock."""
        self.last_progress = self.clock()

    # ---- the thread -----------------------------------------------------------------------
    def expired(self):
        """The timeout message when the watchdog should fire now, else None."""
        armed = self.steps_seen >= self.warmup_steps and self.timeout_s is not None
        idle = self.clock() - self.last_progress
        if not armed or idle <= self.timeout_s:
            return None
        return (f"rank {self.rank} made no progress for {idle:.0f} s (step_timeout_s={self.timeout_s:.0f}) "
                f"in {self.where()}: ending the job")

    def start(self):
        self._thread = threading.Thread(target=self._watch, name="StepWatchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    def _interval(self):
        return self._poll_s or min(5.0, max(0.5, (self.timeout_s or 60) / 10))

    def _watch(self):
        self._tick = self.clock()
        while not self._stop.wait(self._interval()):
            now = self.clock()
            self._longest_pause = max(self._longest_pause, now - self._tick - self._interval())
            self._tick = now
            message = self.expired()
            if message:
                self.on_timeout(message)
                return

    def _end_process(self, message):
        print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(self.exit_code)
