"""Where cases run: an in-process worker (one import of MXNet for many cases) or a process
per case (every case under --subprocess). Both give, per case, a
Finished(code, stderr, fate): fate "" when the process ran to its end, "signal" when the
worker or the process died of one (code then the negative signal number), "hang" when it
went past the case's timeout and was killed.
"""
import json
import os
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from .inputs import REPO, child_env

POLL_S = 0.02


@dataclass
class Finished:
    code: int
    stderr: str
    fate: str = ""           # "", "signal" or "hang"


def limit_memory(gigabytes):
    """preexec_fn: the child's address space capped, so a damaged size field that makes a
    reader allocate without bound fails there (MemoryError, bad_alloc) instead of the machine."""
    def apply():
        limit = int(gigabytes * 2 ** 30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


def _kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def run_process(argv, timeout_s, memory_gb, cwd=REPO):
    """Finished of one process (its own session, killed with its children on timeout)."""
    process = subprocess.Popen(argv, cwd=cwd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, errors="replace", start_new_session=True,
                               preexec_fn=limit_memory(memory_gb))
    try:
        _, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, stderr = process.communicate()
        return Finished(-signal.SIGKILL, stderr, "hang")
    return Finished(process.returncode, stderr, "signal" if process.returncode < 0 else "")


class WorkerLane:
    """One worker process (worker.py) at a time, fed cases one by one; a new one after a
    worker dies or hangs. `folder` holds the cases/state files and the worker's own stderr."""

    def __init__(self, folder, memory_gb):
        self.folder, self.memory_gb, self.process, self.started, self.retired = folder, memory_gb, None, 0, False
        os.makedirs(folder, exist_ok=True)

    def _start(self):
        self.started += 1
        base = os.path.join(self.folder, f"worker{self.started}")
        self.cases_path, self.state_path = base + ".cases.jsonl", base + ".state.jsonl"
        open(self.cases_path, "w").close()
        open(self.state_path, "w").close()
        self.state_offset, self.retired = 0, False
        self.log = open(base + ".stderr", "w")
        self.process = subprocess.Popen([sys.executable, "-m", "bench.fuzz.worker", self.cases_path,
                                         self.state_path], cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL,
                                        stderr=self.log, start_new_session=True,
                                        preexec_fn=limit_memory(self.memory_gb))

    def _events(self):
        with open(self.state_path) as handle:
            handle.seek(self.state_offset)
            text = handle.read()
        complete = text[:text.rfind("\n") + 1]
        self.state_offset += len(complete.encode())
        return [json.loads(line) for line in complete.splitlines() if line]

    def run(self, case_id, module, argv, timeout_s):
        """Finished of `module`.main(argv) in the worker; the clock starts when it starts the case.
        A worker that retired (worker.worn_out) before starting the case is replaced and given it again."""
        for _ in range(3):
            finished = self._run_once(case_id, module, argv, timeout_s)
            if finished is not None:
                return finished
        raise RuntimeError(f"three workers in a row ended before starting case {case_id}; see {self.folder}")

    def _run_once(self, case_id, module, argv, timeout_s):
        if self.process is None or self.process.poll() is not None or self.retired:
            if self.process is not None:
                self.process.wait()
            self._start()
        with open(self.cases_path, "a") as handle:
            handle.write(json.dumps({"id": case_id, "module": module, "argv": argv}) + "\n")
        started_at = None
        waited_from = time.monotonic()
        while True:
            events = self._events()
            self.retired = self.retired or any(event.get("event") == "retired" for event in events)
            for event in events:
                if event.get("id") != case_id:
                    continue
                if event["event"] == "start":
                    started_at = time.monotonic()
                elif event["event"] == "end":
                    return Finished(event["code"], event["stderr"])
            code = self.process.poll()
            if code is not None and started_at is None and not self._events_left():
                self.process = None          # ended before the case: retired, or died starting up
                if code != 0:
                    return Finished(code, self._own_stderr(), "signal" if code < 0 else "")
                return None
            if code is not None and not self._events_left():   # died in the case
                self.process = None
                tail = self._own_stderr()
                return Finished(code, tail, "signal" if code < 0 else "")
            clock = started_at if started_at is not None else waited_from
            if time.monotonic() - clock > timeout_s + (0 if started_at else 120):   # +120: its imports
                _kill_group(self.process)
                self.process = None
                return Finished(-signal.SIGKILL, self._own_stderr(), "hang")
            time.sleep(POLL_S)

    def _events_left(self):
        """Whether the state file holds lines not read yet (read them before deciding)."""
        with open(self.state_path) as handle:
            handle.seek(self.state_offset)
            return bool(handle.read())

    def _own_stderr(self):
        self.log.flush()
        with open(self.log.name, errors="replace") as handle:
            return handle.read()[-4000:]

    def close(self):
        if self.process is not None and self.process.poll() is None:
            with open(self.cases_path, "a") as handle:
                handle.write(json.dumps({"stop": True}) + "\n")
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill_group(self.process)
        self.process = None
