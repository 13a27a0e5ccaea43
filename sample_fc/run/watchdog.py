"""StepWatchdog: end this rank when no training step has finished for too long.

Horovod's stall check sees a rank missing from a collective the others joined; it cannot see
a job where every rank is stuck outside a collective (all data readers on a dead file
system, say). The watchdog can: a thread that ends the process with one line naming the
rank, the step and the stage it was in (the module's stage hook: data, forward, allgather,
..., gradient_sum, bank_update, backbone_update; checkpoint, verification) when no step has finished for the timeout, so the launcher sees a
failure (and, with restarts on, restarts the job from its last checkpoint).

The timeout is `timeout_s` when > 0; with 0 it is set after `warmup_steps` steps to
max(min_auto_s, 10 x the median step time of the next 10 steps). Either way it is armed
only after the first `warmup_steps` steps (start-up, first MXNet graph builds). A long
legitimate stage (a checkpoint, a verification) calls progress() when it ends, so the next
step is timed from there.
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
        self.step, self.stage_name, self.steps_seen = 0, "start", 0
        self.last_progress = clock()
        self._durations = []
        self._stop = threading.Event()
        self._poll_s = poll_s
        self._thread = None

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
                f"in step {self.step + 1}, stage {self.stage_name}: ending the job")

    def start(self):
        self._thread = threading.Thread(target=self._watch, name="StepWatchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    def _watch(self):
        while not self._stop.wait(self._poll_s or min(5.0, max(0.5, (self.timeout_s or 60) / 10))):
            message = self.expired()
            if message:
                self.on_timeout(message)
                return

    def _end_process(self, message):
        print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(self.exit_code)
