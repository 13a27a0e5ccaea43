"""Runs the cases: each one's inputs copied and one file damaged, the command run in its lane,
the outcome classified and the inputs re-hashed. Lanes (default 2) take cases from one queue:
each an in-process worker (lanes.WorkerLane: the tools and train.py), or with subprocess_only
a process per case (lanes.run_process).
"""
import os
import shutil
import sys
import threading
import time

import numpy as np

from .cases import TOOL_MODULES, TRAIN_COMMANDS, swap_partner
from .damage import damage
from .inputs import REPO
from .lanes import WorkerLane, run_process
from .outcomes import changed_files, classify, file_hashes



def run_files(hashes):
    """The files of a models root outside its checkpoints (config.json, train.log, status.json,
    events, verification/, ...): a resumed run continues in its root and rewrites them."""
    return [path for path in hashes if path.startswith("models" + os.sep) and
            not path.split(os.sep)[1].startswith("step-")]


def prepare(case, inputs, folder):
    """The case's folder: in/ (its input groups copied, the damaged file written), out/ (empty).
    Returns (argv with {in}/{out} filled, hashes of in/ before the run)."""
    shutil.rmtree(folder, ignore_errors=True)
    given, out = os.path.join(folder, "in"), os.path.join(folder, "out")
    os.makedirs(out)
    for group in case.groups:
        shutil.copytree(os.path.join(inputs, group), os.path.join(given, group))
    rng = np.random.default_rng((case.seed, case.id, 1))
    with open(os.path.join(inputs, case.file), "rb") as handle:
        data = handle.read()
    other = b""
    if case.damage == "swap":
        with open(os.path.join(inputs, swap_partner(inputs, case, rng)), "rb") as handle:
            other = handle.read()
    with open(os.path.join(given, case.file), "wb") as handle:
        handle.write(damage(case.damage, rng, data, other))
    argv = [arg.replace("{in}", given).replace("{out}", out) for arg in case.argv]
    return argv, file_hashes(given)


def command_line(case, argv):
    """The argv of the case as its own process."""
    if case.command in TRAIN_COMMANDS:
        return [sys.executable, os.path.join(REPO, "train.py"), *argv]
    return [sys.executable, "-m", TOOL_MODULES[case.command], *argv]


class Harness:
    """Runs cases in `folder` (one subfolder per running case), results in self.results."""

    def __init__(self, inputs, folder, timeout_s=120, memory_gb=8, subprocess_only=False, keep=False,
                 progress=None):
        self.inputs, self.folder, self.timeout_s, self.memory_gb = inputs, folder, timeout_s, memory_gb
        self.subprocess_only, self.keep, self.progress = subprocess_only, keep, progress
        self.results, self._lock = [], threading.Lock()

    def _one(self, case, run):
        folder = os.path.join(self.folder, f"case{case.id:05d}")
        argv, before = prepare(case, self.inputs, folder)
        start = time.monotonic()
        finished = run(case, argv)
        seconds = time.monotonic() - start
        may_change = run_files(before) if case.command == "train_resume" else ()
        changed = changed_files(before, file_hashes(os.path.join(folder, "in")), may_change)
        outcome = classify(case.command, finished, changed)
        result = dict(case.to_json(), outcome=outcome, code=finished.code, seconds=round(seconds, 2),
                      changed=changed, stderr_tail=[line[:500] for line in finished.stderr.strip().splitlines()[-12:]])
        if not self.keep:
            shutil.rmtree(folder, ignore_errors=True)
        with self._lock:
            self.results.append(result)
            if self.progress:
                self.progress(result, len(self.results))

    def _next(self, queue):
        with self._lock:
            return queue.pop(0) if queue else None

    def _process_lane(self, queue):
        while (case := self._next(queue)) is not None:
            self._one(case, lambda c, argv: run_process(command_line(c, argv), self._timeout(c), self.memory_gb))

    def _worker_lane(self, queue, number):
        lane = WorkerLane(os.path.join(self.folder, f"lane{number}"), self.memory_gb)
        try:
            while (case := self._next(queue)) is not None:
                module = "train" if case.command in TRAIN_COMMANDS else TOOL_MODULES[case.command]
                self._one(case, lambda c, argv: lane.run(c.id, module, argv, self._timeout(c)))
        finally:
            lane.close()

    def _timeout(self, case):
        return self.timeout_s * (2 if case.command in TRAIN_COMMANDS else 1)

    def run(self, cases, lanes=2):
        """Every case, `lanes` at a time, each lane taking the next case of one queue: worker
        lanes (in-process), or with subprocess_only a process per case."""
        os.makedirs(self.folder, exist_ok=True)
        queue = list(cases)
        target = self._process_lane if self.subprocess_only else self._worker_lane
        threads = [threading.Thread(target=target, args=(queue,) if self.subprocess_only else (queue, n))
                   for n in range(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sorted(self.results, key=lambda r: r["id"])
