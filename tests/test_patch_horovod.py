"""Tests for scripts/patch_horovod.py, the source fixes applied before building Horovod."""
import ast
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "patch_horovod.py"
GLOO_CONTROLLER = "horovod/common/gloo/gloo_controller.cc"
LAUNCH = "horovod/runner/launch.py"
GLOO_RUN = "horovod/runner/gloo_run.py"
MPI_RUN = "horovod/runner/mpi_run.py"
OPERATIONS = "horovod/common/operations.cc"
SAFE_SHELL_EXEC = "horovod/runner/common/util/safe_shell_exec.py"
UTIL = "horovod/common/util.py"
QUEUE_AND_LOG = ("  Status status = process_set.tensor_queue.AddToTensorQueue(e, message);\n"
                 "  if (status.ok()) {\n"
                 "    LOG(TRACE, horovod_global.global_controller->GetRank())\n"
                 "        << \"Enqueued \" << name;\n"
                 "  }\n"
                 "  return status;\n"
                 "}\n")
# The pieces of Horovod 0.28.1's source the fixes replace, with a line of context each.
BUGGY = {
    GLOO_CONTROLLER: "  global_ranks_.reserve(size_);\n  {\n    auto this_global_rank = 0;\n",
    LAUNCH: "def parse_args():\n    parser = argparse.ArgumentParser(description='Horovod Runner')\n",
    MPI_RUN: "    basic_args = '-l' if impi_or_mpich else '--allow-run-as-root --tag-output'\n",
    GLOO_RUN: (
        "import sys\n\n\ndef launch_gloo(res):\n"
        "    for name, value in sorted(res.items(), key=lambda item: item[1][1]):\n"
        "        exit_code, timestamp = value\n"
        "        if exit_code != 0:\n"
        "            raise RuntimeError('Horovod detected that one or more processes exited with non-zero '\n"
        "                               'status, thus causing the job to be terminated. The first process '\n"
        "                               'to do so was:\\nProcess name: {name}\\nExit code: {code}\\n'\n"
        "                               .format(name=name, code=exit_code))\n"
        "\n\ndef register_shutdown_event():\n"
        "    # Create a event for communication between threads\n"
        "    event = threading.Event()\n\n"
        "    def set_event_on_signal(signum, frame):\n"
        "        event.set()\n\n"
        "    signal.signal(signal.SIGINT, set_event_on_signal)\n"
        "    signal.signal(signal.SIGTERM, set_event_on_signal)\n"
        "    return event\n"),
    SAFE_SHELL_EXEC: "import os\nimport signal\nimport time\n\nimport psutil\n\n" + 'GRACEFUL_TERMINATION_TIME_S = 5\n\n\ndef terminate_executor_shell_and_children(pid):\n    # If the shell already ends, no need to terminate its child.\n    try:\n        p = psutil.Process(pid)\n    except psutil.NoSuchProcess:\n        return\n\n    # Terminate children gracefully.\n    for child in p.children():\n        try:\n            child.terminate()\n        except psutil.NoSuchProcess:\n            pass\n\n    # Wait for graceful termination.\n    gone, alive = psutil.wait_procs(p.children(), timeout=GRACEFUL_TERMINATION_TIME_S)\n\n    # Freeze the process to prevent it from spawning any new children.\n    try:\n        p.send_signal(signal.SIGSTOP)\n    except psutil.NoSuchProcess:\n        pass\n\n    # Kill children recursively.\n    for child in alive:\n        try:\n            for grandchild in child.children(recursive=True):\n                try:\n                    grandchild.kill()\n                except psutil.NoSuchProcess:\n                    pass\n            child.kill()\n        except psutil.NoSuchProcess:\n            pass\n\n    # Kill shell itself.\n    try:\n        p.terminate()\n    except psutil.NoSuchProcess:\n        pass\n\n    try:\n        p.wait(timeout=GRACEFUL_TERMINATION_TIME_S)\n    except psutil.TimeoutExpired:\n        try:\n            p.kill()\n        except psutil.NoSuchProcess:\n            pass\n\n',
    UTIL: ("import json\nimport multiprocessing\nimport os\n\n\n"
           'def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):\n'
           '    """\n'
           '    Tries to load the extension in a new process.  If successful, puts fn(ext)\n'
           '    to the queue or False otherwise.  Mutes all stdout/stderr.\n'
           '    """\n'
           '    def _target_fn(ext_base_name, fn, fn_desc, queue, verbose):\n'
           '        import importlib\n'
           '        import sys\n'
           '        import traceback\n'
           '\n'
           '        if verbose:\n'
           "            print('Checking whether extension {ext_base_name} was {fn_desc}.'.format(\n"
           '                ext_base_name=ext_base_name, fn_desc=fn_desc))\n'
           '        else:\n'
           '            # Suppress output\n'
           "            sys.stdout = open(os.devnull, 'w')\n"
           "            sys.stderr = open(os.devnull, 'w')\n"
           '\n'
           '        try:\n'
           "            ext = importlib.import_module('.' + ext_base_name, 'horovod')\n"
           '            result = fn(ext)\n'
           '        except:\n'
           '            traceback.print_exc()\n'
           '            result = None\n'
           '\n'
           '        if verbose:\n'
           "            print('Extension {ext_base_name} {flag} {fn_desc}.'.format(\n"
           "                ext_base_name=ext_base_name, flag=('was' if result else 'was NOT'),\n"
           '                fn_desc=fn_desc))\n'
           '\n'
           '        queue.put(result)\n'
           '\n'
           "    # 'fork' is required because horovodrun is a frozen executable\n"
           "    ctx = multiprocessing.get_context('fork')\n"
           '    queue = ctx.Queue()\n'
           '    p = ctx.Process(target=_target_fn,\n'
           '                    args=(ext_base_name, fn, fn_desc, queue, verbose))\n'
           '    p.daemon = True\n'
           '    p.start()\n'
           '    p.join()\n'
           '    return queue.get_nowait()\n'
           ),
    # broadcast, alltoall and join each log the caller's name after queueing the entry
    OPERATIONS: "".join(f"Status Enqueue{op}(const std::string& name) {{\n" + QUEUE_AND_LOG
                        for op in ("TensorBroadcast", "TensorAlltoall", "Join")),
}


def _tree(tmp_path, files=BUGGY):
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _patch(tmp_path):
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)


def test_fixes_apply_once_and_are_idempotent(tmp_path):
    """Test that reserve() becomes resize(), horovodrun's parser loses abbreviations, mpirun
    runs --quiet, the Gloo launcher exits with the worker's code instead of raising, every
    queued name is copied before its entry is queued, the build checks keep their answers
    in front of the unchanged in-process check, and a second run changes nothing."""
    _tree(tmp_path)
    for _ in range(2):
        result = _patch(tmp_path)
        assert result.returncode == 0, result.stderr
        assert (tmp_path / GLOO_CONTROLLER).read_text() == BUGGY[GLOO_CONTROLLER].replace(
            "reserve(size_)", "resize(size_)")
        assert (tmp_path / LAUNCH).read_text() == BUGGY[LAUNCH].replace(
            "'Horovod Runner')", "'Horovod Runner', allow_abbrev=False)")
        assert (tmp_path / MPI_RUN).read_text() == BUGGY[MPI_RUN].replace(
            "--tag-output'", "--tag-output --quiet'")
        gloo_run = (tmp_path / GLOO_RUN).read_text()
        assert "raise RuntimeError" not in gloo_run and "sys.exit(exit_code" in gloo_run
        assert "if event.is_set():" in gloo_run            # both fixes of this file are in it
        assert "HOROVOD_GRACEFUL_TERMINATION_TIME_S" in (tmp_path / SAFE_SHELL_EXEC).read_text()
        util = (tmp_path / UTIL).read_text()
        assert util.count("def _check_extension_lambda(") == 1 and util.count("def _check_extension_in_process(") == 1
        assert util.endswith("    return queue.get_nowait()\n")     # the in-process check's body, unchanged
        operations = (tmp_path / OPERATIONS).read_text()
        assert "<< name;" not in operations
        for function in operations.split("Status Enqueue")[1:]:   # the copy comes before the queue
            copy, queue, log = (function.index(text) for text in (
                "const std::string queued_name = name;", "AddToTensorQueue(e, message)",
                "<< \"Enqueued \" << queued_name;"))
            assert copy < queue < log, function


def test_patched_gloo_launcher_exits_with_the_workers_code(tmp_path, capsys):
    """Test that the patched launcher code runs: one stderr line naming the process, and
    SystemExit with the worker's exit code (2 stays 2; a signal's negative code becomes 1)."""
    _tree(tmp_path)
    assert _patch(tmp_path).returncode == 0
    source = (tmp_path / GLOO_RUN).read_text()
    ast.parse(source)
    namespace = {}
    exec(compile(source, GLOO_RUN, "exec"), namespace)
    for worker_code, expected in ((2, 2), (-9, 1)):
        try:
            namespace["launch_gloo"]({"localhost[0]": (0, 1.0), "localhost[1]": (worker_code, 2.0)})
        except SystemExit as stop:
            assert stop.code == expected
        else:
            raise AssertionError("the patched launcher did not exit")
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "localhost[1]" in err and str(worker_code) in err


def _patched_build_checks(tmp_path):
    """The patched util.py's functions, run as Horovod's file at tmp_path/horovod/common/util.py
    beside a fake MXNet extension library, with the in-process check replaced by a counter."""
    _tree(tmp_path)
    assert _patch(tmp_path).returncode == 0
    library = tmp_path / "horovod" / "mxnet" / "mpi_lib.cpython-311-x86_64-linux-gnu.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"built")
    namespace = {"__file__": str(tmp_path / UTIL)}
    exec(compile((tmp_path / UTIL).read_text(), UTIL, "exec"), namespace)
    asked, answer = [], {"value": True}

    def in_process(ext_base_name, fn, fn_desc, verbose):
        asked.append((ext_base_name, fn_desc, verbose))
        return answer["value"]
    namespace["_check_extension_in_process"] = in_process
    return namespace, library, asked, answer


def test_build_answers_are_kept_while_the_extension_files_stay_the_same(tmp_path):
    """Test that the patched check loads the extension once per question and keeps the answer
    beside util.py; that a changed library, a verbose check, a question about the machine
    and an extension that did not load ask again; and that a damaged answers file is asked
    around and rewritten."""
    checks, library, asked, answer = _patched_build_checks(tmp_path)
    check = checks["_check_extension_lambda"]
    gloo = ("mxnet", None, "built with Gloo", False)
    assert check(*gloo) is True and len(asked) == 1
    kept = json.loads(Path(checks["BUILT_ANSWERS"]).read_text())
    assert Path(checks["BUILT_ANSWERS"]).parent == tmp_path / "horovod" / "common"
    assert kept["mxnet built with Gloo"][1] is True and str(library) in kept["mxnet built with Gloo"][0][0]
    assert check(*gloo) is True and check(*gloo) is True and len(asked) == 1
    answer["value"] = False
    assert check("mxnet", None, "built with MPI", False) is False and len(asked) == 2
    assert check("mxnet", None, "built with MPI", False) is False and len(asked) == 2
    library.write_bytes(b"rebuilt")                                  # another build: asked again
    assert check(*gloo) is False and len(asked) == 3
    assert check("mxnet", None, "built with Gloo", True) is False and len(asked) == 4      # verbose
    for _ in range(2):
        check("mxnet", None, "running with GPU", False)
    assert len(asked) == 6
    answer["value"] = None                                           # the extension did not load
    for _ in range(2):
        assert check("torch", None, "built with Gloo", False) is None
    assert len(asked) == 8 and "torch built with Gloo" not in json.loads(Path(checks["BUILT_ANSWERS"]).read_text())
    Path(checks["BUILT_ANSWERS"]).write_text("{damaged")
    answer["value"] = True
    assert check(*gloo) is True and len(asked) == 9
    assert json.loads(Path(checks["BUILT_ANSWERS"]).read_text())["mxnet built with Gloo"][1] is True


def test_the_installed_horovod_keeps_answers_equal_to_loading_the_extension():
    """Test that the bootstrap's Horovod has the kept build answers, and that what horovodrun
    asks (built with Gloo, with MPI) equals what loading MXNet's extension in a process says."""
    probe = ("from horovod.common import util\n"
             "fresh = [util._check_extension_in_process('mxnet', fn, desc, False) for fn, desc in (\n"
             "    (lambda ext: ext.gloo_built(), 'built with Gloo'), (lambda ext: ext.mpi_built(), 'built with MPI'))]\n"
             "print(fresh, [util.gloo_built(), util.mpi_built()], [util.gloo_built(), util.mpi_built()])\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    fresh, kept, again = ast.literal_eval("[" + result.stdout.strip().replace("] [", "], [") + "]")
    assert fresh[0] is True and kept == fresh and again == fresh


def test_unexpected_source_stops_with_the_file_named(tmp_path):
    """Test that a source without the expected text (another Horovod) fails, naming file and
    text, and that no other file was changed."""
    _tree(tmp_path, dict(BUGGY, **{GLOO_CONTROLLER: "  global_ranks_.assign(size_, 0);\n"}))
    result = _patch(tmp_path)
    assert result.returncode != 0
    assert GLOO_CONTROLLER in result.stderr and "global_ranks_.reserve(size_);" in result.stderr
    assert (tmp_path / GLOO_CONTROLLER).read_text() == "  global_ranks_.assign(size_, 0);\n"
    assert (tmp_path / LAUNCH).read_text() == BUGGY[LAUNCH]        # all fixes or none


def test_a_partly_fixed_source_stops(tmp_path):
    """Test that a fix expected in several places (the queued names: 3) stops the build when
    the source has it in fewer, and changes nothing."""
    partly = BUGGY[OPERATIONS].replace("<< name;", "<< other;", 1)
    _tree(tmp_path, dict(BUGGY, **{OPERATIONS: partly}))
    result = _patch(tmp_path)
    assert result.returncode != 0
    assert OPERATIONS in result.stderr and "exactly 3 time(s), found it 2 times" in result.stderr
    assert (tmp_path / OPERATIONS).read_text() == partly
    assert (tmp_path / GLOO_CONTROLLER).read_text() == BUGGY[GLOO_CONTROLLER]


def test_missing_file_is_reported(tmp_path):
    """Test that a directory that is not a Horovod source tree fails with "not found"."""
    result = _patch(tmp_path)
    assert result.returncode != 0 and "not found" in result.stderr


STOPS_CLEANLY = """
import signal, sys, time
def stop(number, frame):
    time.sleep(1.0)                                # a checkpoint's worth of work
    open(sys.argv[1], "w").write("stopped")
    sys.exit(128 + number)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""
IGNORES_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def _patched_terminate(tmp_path, grace_s):
    """The patched terminate_executor_shell_and_children, its grace set by the environment."""
    _tree(tmp_path)
    assert _patch(tmp_path).returncode == 0
    namespace = {}
    previous = os.environ.get("HOROVOD_GRACEFUL_TERMINATION_TIME_S")
    os.environ["HOROVOD_GRACEFUL_TERMINATION_TIME_S"] = str(grace_s)
    try:
        exec(compile((tmp_path / SAFE_SHELL_EXEC).read_text(), SAFE_SHELL_EXEC, "exec"), namespace)
    finally:
        os.environ.pop("HOROVOD_GRACEFUL_TERMINATION_TIME_S")
        if previous is not None:
            os.environ["HOROVOD_GRACEFUL_TERMINATION_TIME_S"] = previous
    return namespace["terminate_executor_shell_and_children"]


def _started(code, *args, shell=False):
    """A process running `code` (directly, as the shell's exec does, or under a shell that stays)."""
    command = [sys.executable, "-c", code, *map(str, args)]
    if shell:
        command = ["sh", "-c", shlex.join(command) + "; true"]     # a compound command: the shell stays
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.parametrize("shell", [False, True])
def test_patched_termination_lets_the_worker_stop_cleanly(tmp_path, shell):
    """Test that the patched termination sends SIGTERM to the worker itself (or to what a shell
    runs) and waits for it: a worker that takes 1 s to stop on SIGTERM finishes its work and
    exits 143, not frozen by SIGSTOP or killed after Horovod's 5 s (here the grace is 10 s)."""
    terminate = _patched_terminate(tmp_path, 10)
    marker = tmp_path / "stopped.txt"
    process = _started(STOPS_CLEANLY, marker, shell=shell)
    start = time.monotonic()
    terminate(process.pid)
    assert process.wait(timeout=10) == (0 if shell else 143)
    assert marker.read_text() == "stopped" and time.monotonic() - start < 8


def test_patched_termination_kills_what_ignores_the_signal_after_the_grace(tmp_path):
    """Test that a worker ignoring SIGTERM is killed once the grace (1 s) is over."""
    terminate = _patched_terminate(tmp_path, 1)
    process = _started(IGNORES_TERM)
    start = time.monotonic()
    terminate(process.pid)
    assert process.wait(timeout=10) == -signal.SIGKILL and 0.9 < time.monotonic() - start < 5


def test_patched_termination_of_a_shell_reaped_meanwhile(tmp_path):
    """Test that termination ends quietly when the shell ends with its command and is reaped
    while the termination runs (Horovod's middleman waits for the shell in its main thread):
    psutil then raises NoSuchProcess for the shell, which escaped the terminating thread as a
    traceback on the launcher's stderr after a worker's one-line error."""
    terminate = _patched_terminate(tmp_path, 10)
    for attempt in range(3):
        marker = tmp_path / f"stopped{attempt}.txt"        # each worker's own: proof it stopped cleanly
        process = _started(STOPS_CLEANLY, marker, shell=True)
        reaper = threading.Thread(target=process.wait)     # as the middleman's main thread
        reaper.start()
        terminate(process.pid)                             # raised NoSuchProcess before the fix
        reaper.join(timeout=10)
        assert process.returncode == 0 and marker.read_text() == "stopped"
