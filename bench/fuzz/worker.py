"""A worker process that runs many cases (the tools' and train.py's) in-process, importing MXNet once.

    python -m bench.fuzz.worker CASES STATE

train.py runs here too (module "train"): Horovod is initialised per case and shut down as
train.py does it, and train.py's os._exit (which skips interpreter teardown once Horovod ran)
raises SystemExit in this process instead, so that the worker lives on; a step watchdog a
failed case left running is stopped after it.

CASES is a JSON-lines file the harness appends to: {"id", "module", "argv"} per case, then
{"stop": true}. For each case the worker appends to STATE {"id", "event": "start"} before it
runs and {"id", "event": "end", "code", "stderr"} after (and {"event": "retired"} when it
ends itself after a case, worn_out): `code` is what the process would have exited with (main's
return, SystemExit's code, 1 for an exception, whose traceback is printed to the case's stderr
as Python prints it), `stderr` the case's captured stderr. If the worker dies (a signal) or stops
writing (a hang), the harness sees the case started and not ended.
"""
import contextlib
import importlib
import io
import json
import os
import sys
import time
import traceback

POLL_S = 0.02
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _OsExitRaises:
    """train.py's `os`, but for _exit, which raises SystemExit (the worker must outlive a case)."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def _exit(code):
        raise SystemExit(code)


_watchdogs = []


def _train_module():
    """train.py imported once, patched as the module docstring says."""
    if "train" not in sys.modules:
        sys.path.insert(0, REPO)
        import train
        train.os = _OsExitRaises()
        base = train.StepWatchdog

        class TrackedWatchdog(base):
            def start(self):
                _watchdogs.append(self)
                return super().start()
        train.StepWatchdog = TrackedWatchdog
    return sys.modules["train"]


def _after_train():
    """After a train.py case, whatever its end: its watchdog stopped, MXNet's engine drained of
    the case's pending operations (a failed step leaves Horovod allreduces enqueued, which
    otherwise fail in the next case with 'Horovod has not been initialized' or a shutdown
    error), then Horovod shut down, as a process that exits would leave it."""
    import mxnet as mx
    from sample_fc import dist
    while _watchdogs:
        _watchdogs.pop().stop()
    for step in (mx.nd.waitall, dist.shutdown, mx.nd.waitall):
        try:
            step()
        except mx.base.MXNetError:
            pass          # the case's own failure, already reported by it


def run_case(module, argv):
    """(exit code, stderr text) of `module`.main(argv) run here, stdout discarded."""
    stderr, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(stdout):
        try:
            main = _train_module().main if module == "train" else importlib.import_module(module).main
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
            if isinstance(code, str):            # sys.exit("message"): printed, exit 1
                print(code, file=sys.stderr)
                code = 1
        except BaseException:                    # noqa: B902 what the interpreter would print
            traceback.print_exc()
            code = 1
        finally:
            if module == "train":
                _after_train()
    return (0 if code is None else int(code)), stderr.getvalue()


def cases(path):
    """The cases appended to `path`, as they come, until {"stop": true} (or the harness that
    started this worker is gone)."""
    harness = os.getppid()
    with open(path) as handle:
        pending = ""
        while True:
            line = handle.readline()
            if not line:
                if os.getppid() != harness:
                    return
                time.sleep(POLL_S)
                continue
            pending += line
            if not pending.endswith("\n"):
                continue
            case, pending = json.loads(pending), ""
            if case.get("stop"):
                return
            yield case


def worn_out():
    """Whether this worker should end after its case, for a fresh one: train.py cases that fail
    mid-run leave threads (a data iterator's decoders) and memory behind, which in one process
    would pile up until thread creation or an allocation fails (a signal or an error not the
    case's own). True past 48 threads or half the address space allowed."""
    import resource
    import threading
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    with open("/proc/self/status") as status:
        size_kb = next((int(line.split()[1]) for line in status if line.startswith("VmSize:")), 0)
    return threading.active_count() > 48 or (limit != resource.RLIM_INFINITY and size_kb * 1024 > limit // 2)


def main(argv=None):
    cases_path, state_path = argv or sys.argv[1:]
    with open(state_path, "a") as state:
        def record(entry):
            state.write(json.dumps(entry) + "\n")
            state.flush()
        for case in cases(cases_path):
            record({"id": case["id"], "event": "start"})
            code, stderr = run_case(case["module"], case["argv"])
            record({"id": case["id"], "event": "end", "code": code, "stderr": stderr[-65536:]})
            if worn_out():
                record({"event": "retired"})
                break
    sys.stdout.flush()
    os._exit(0)      # no interpreter teardown under MXNet's threads: the harness has every result


if __name__ == "__main__":
    main()
