"""Fix known bugs in the Horovod 0.28.1 source tree before scripts/bootstrap.sh builds it.

    python scripts/patch_horovod.py <extracted horovod-0.28.1 directory>

Each fix replaces one exact piece of text that must occur exactly as often as in Horovod
0.28.1 (once unless the fix says; or is already fixed); anything else stops the build with
the file and text named, so a different Horovod source never gets half-patched.

1. Stall shutdown under Gloo. GlooController::Initialize sizes the list of global ranks
   with reserve() instead of resize(), so the list stays empty. The stall inspector walks
   that list to find missing ranks, so under the Gloo controller it never warns and never
   shuts a stalled job down: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (train.py's
   collective_timeout_s) did nothing and a hung rank hung the whole job. MPI is unaffected.
2. Abbreviations. horovodrun's argparse matches abbreviations, and on Python >= 3.11 it
   also scans the training command: `python train.py --network r100` (or `--net`) fails as
   "ambiguous option: --network could match --network-interfaces, --network-interface".
   The parser gets allow_abbrev=False: the command's options pass through untouched;
   horovodrun's own options must be spelled in full (-np, -H, --gloo, --mpi, ...).
3. A worker's error exit under Gloo. When a worker exits non-zero, horovodrun raised a
   RuntimeError whose traceback followed the worker's own one-line error and exited 1.
   Now it prints one line naming the process and exits with the worker's code, as mpirun
   does (static Gloo jobs; the elastic driver is unchanged).
4. A worker's error exit under MPI. OpenMPI's mpirun followed the worker's one-line error
   with a 10-line "Primary job terminated normally, but 1 process returned a non-zero exit
   code" banner; horovodrun now passes --quiet, which drops only such help texts (the
   workers' output and the exit code are unchanged).
5. A freed name read after a broadcast is queued. EnqueueTensorBroadcast (also the
   alltoall and join ones) logs "Enqueued <name>" after handing the entry to the queue,
   reading `name` by reference from the caller's operation. The background thread can
   finish that collective and MXNet can free the operation (and its name) before the log
   line runs: on a loaded machine, rarely, a worker segfaulted at start-up while the
   backbone's parameters were broadcast (a core dump showed the engine thread in that log
   line, copying a freed string). The name is now copied before the entry is queued.
6. Stopping a job. On SIGINT or SIGTERM horovodrun stopped each worker by SIGSTOP and then
   SIGKILL after 5 s: the local shell execs the worker's command, so the "children" it sent
   SIGTERM to were none, and the worker itself was frozen before it could act. Now the worker
   (or, when a shell still runs it, the shell's processes) gets SIGTERM first and
   HOROVOD_GRACEFUL_TERMINATION_TIME_S (default 60 s) to exit, then whatever is left is
   killed: sample_fc's train.py stops every rank at the same step and checkpoints in that time.
   A second SIGINT/SIGTERM to horovodrun is passed on to the workers (they then end at once).
   When the worker runs under a shell, the shell ends with it and Horovod's middleman reaps it
   meanwhile: the termination now returns then, where psutil's NoSuchProcess for the shell
   escaped its thread as a truncated traceback after a worker's one-line error.
7. The launch's build checks. Before it starts any worker, horovodrun asks whether Horovod was
   built with Gloo (and, without --gloo, with MPI) by loading each framework's extension in a
   forked process: for MXNet that imports MXNet, about 1.2 s of every launch's 2 s here,
   spent before each job and each restart. What an extension was built with is a property of
   its files, so the answer is now kept in horovod/common/built_answers.json with the names,
   sizes and times of the extension's libraries and of its framework's package; while those
   are the same, the answer is read from there. A check that could not load the extension
   (no answer), a verbose check, and questions about the machine (a GPU) still run every time.
"""
import sys
from pathlib import Path
from typing import NamedTuple


class Fix(NamedTuple):
    """`old` -> `new` in `file`, where Horovod 0.28.1 has `old` exactly `times` times."""
    file: str
    old: str
    new: str
    times: int = 1


FIXES = [
    Fix("horovod/common/gloo/gloo_controller.cc",
        "global_ranks_.reserve(size_);", "global_ranks_.resize(size_);"),
    Fix("horovod/runner/launch.py",
        "parser = argparse.ArgumentParser(description='Horovod Runner')",
        "parser = argparse.ArgumentParser(description='Horovod Runner', allow_abbrev=False)"),
    Fix("horovod/runner/mpi_run.py",
        "basic_args = '-l' if impi_or_mpich else '--allow-run-as-root --tag-output'",
        "basic_args = '-l' if impi_or_mpich else '--allow-run-as-root --tag-output --quiet'"),
    Fix("horovod/runner/gloo_run.py",
        """    for name, value in sorted(res.items(), key=lambda item: item[1][1]):
        exit_code, timestamp = value
        if exit_code != 0:
            raise RuntimeError('Horovod detected that one or more processes exited with non-zero '
                               'status, thus causing the job to be terminated. The first process '
                               'to do so was:\\nProcess name: {name}\\nExit code: {code}\\n'
                               .format(name=name, code=exit_code))""",
        """    for name, value in sorted(res.items(), key=lambda item: item[1][1]):
        exit_code, timestamp = value
        if exit_code != 0:
            sys.stderr.write('horovodrun: process {name} exited first, with code {code}; the job '
                             'was stopped\\n'.format(name=name, code=exit_code))
            sys.exit(exit_code if 0 < exit_code < 256 else 1)"""),
    Fix("horovod/common/operations.cc",
        """  Status status = process_set.tensor_queue.AddToTensorQueue(e, message);
  if (status.ok()) {
    LOG(TRACE, horovod_global.global_controller->GetRank())
        << "Enqueued " << name;
  }""",
        """  const std::string queued_name = name;  // `name` may be freed once the entry is queued
  Status status = process_set.tensor_queue.AddToTensorQueue(e, message);
  if (status.ok()) {
    LOG(TRACE, horovod_global.global_controller->GetRank())
        << "Enqueued " << queued_name;
  }""", 3),
    Fix("horovod/runner/common/util/safe_shell_exec.py",
        "GRACEFUL_TERMINATION_TIME_S = 5",
        "GRACEFUL_TERMINATION_TIME_S = float(os.environ.get('HOROVOD_GRACEFUL_TERMINATION_TIME_S', '60'))"),
    Fix("horovod/runner/common/util/safe_shell_exec.py",
        """    # Terminate children gracefully.
    for child in p.children():
""",
        """    # SIGTERM to the command first (the shell execs a simple command; else to the processes it
    # runs), which may stop cleanly (checkpoint) within the grace; then everything left is killed.
    try:
        targets = p.children(recursive=True) or [p]
    except psutil.NoSuchProcess:
        return
    for target in targets:
        try:
            target.terminate()
        except psutil.NoSuchProcess:
            pass

    def running(process):   # polled, not waited for: the exit code stays for the process's parent
        try:
            return process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + GRACEFUL_TERMINATION_TIME_S
    while any(running(target) for target in targets) and time.monotonic() < deadline:
        time.sleep(0.1)
    for target in targets:
        try:
            target.kill()
        except psutil.NoSuchProcess:
            pass
    if targets == [p]:   # the command itself: nothing else to end
        return
    try:
        shell_children = p.children()
    except psutil.NoSuchProcess:   # the shell ended with its command and was reaped meanwhile
        return

    # Terminate children gracefully.
    for child in shell_children:
"""),
    Fix("horovod/runner/common/util/safe_shell_exec.py",
        "gone, alive = psutil.wait_procs(p.children(), timeout=GRACEFUL_TERMINATION_TIME_S)",
        "gone, alive = psutil.wait_procs(shell_children, timeout=GRACEFUL_TERMINATION_TIME_S)"),
    Fix("horovod/runner/gloo_run.py",
        """    def set_event_on_signal(signum, frame):
        event.set()
""",
        """    def set_event_on_signal(signum, frame):
        if event.is_set():   # a second signal: passed on to the workers (the leaves), which end at once
            import psutil
            for process in psutil.Process().children(recursive=True):
                try:
                    if not process.children():
                        process.send_signal(signum)
                except psutil.NoSuchProcess:
                    pass
        event.set()
"""),
    Fix("horovod/common/util.py",
        """def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    \"\"\"
    Tries to load the extension in a new process.  If successful, puts fn(ext)
    to the queue or False otherwise.  Mutes all stdout/stderr.
    \"\"\"
""",
        """BUILT_ANSWERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'built_answers.json')


def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    \"\"\"
    fn(ext) for the extension; what it was built with ('built ...') is kept in BUILT_ANSWERS
    with a description of its files and read from there while they are the same.
    \"\"\"
    if verbose or not fn_desc.startswith('built'):
        return _check_extension_in_process(ext_base_name, fn, fn_desc, verbose)
    question, files = '{} {}'.format(ext_base_name, fn_desc), _extension_files(ext_base_name)
    answers = _built_answers()
    if answers.get(question, [None])[0] == files:
        return answers[question][1]
    result = _check_extension_in_process(ext_base_name, fn, fn_desc, verbose)
    if result is not None:   # None: the extension did not load; ask again next time
        answers[question] = [files, result]
        _keep_built_answers(answers)
    return result


def _extension_files(ext_base_name):
    \"\"\"Path, size and time of the extension's libraries and of its framework's package.\"\"\"
    import glob
    import importlib.util
    package = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ext_base_name)
    paths = sorted(glob.glob(os.path.join(package, '*.so')))
    try:
        framework = importlib.util.find_spec(ext_base_name)
    except (ImportError, ValueError):
        framework = None
    if framework is not None and framework.origin:
        paths.append(framework.origin)
    described = []
    for path in paths:
        stat = os.stat(path)
        described.append('{} {} {}'.format(path, stat.st_size, stat.st_mtime_ns))
    return described


def _built_answers():
    try:
        with open(BUILT_ANSWERS) as answers_file:
            answers = json.load(answers_file)
    except (OSError, ValueError):
        return {}
    return answers if isinstance(answers, dict) else {}


def _keep_built_answers(answers):
    partial = '{}.{}'.format(BUILT_ANSWERS, os.getpid())
    try:   # whole or not at all; where this install is read-only, the check runs each time
        with open(partial, 'w') as answers_file:
            json.dump(answers, answers_file, indent=1, sort_keys=True)
        os.replace(partial, BUILT_ANSWERS)
    except OSError:
        pass


def _check_extension_in_process(ext_base_name, fn, fn_desc, verbose):
    \"\"\"
    Tries to load the extension in a new process.  If successful, puts fn(ext)
    to the queue or False otherwise.  Mutes all stdout/stderr.
    \"\"\"
"""),
]


def apply_fixes(source_root):
    """Check every fix against the source first, then write: all fixes or none."""
    texts, notes = {}, []           # a file's text with the fixes so far (several may touch one file)
    for relative, old, new, times in FIXES:
        path = Path(source_root) / relative
        if not path.is_file():
            sys.exit(f"patch_horovod: {path} not found; expected a horovod-0.28.1 source tree")
        text = texts.get(path) or path.read_text()
        found = text.count(old)
        if found == 0 and text.count(new) == times:
            print(f"patch_horovod: {relative}: already fixed")
            continue
        if found != times:
            sys.exit(f"patch_horovod: {relative}: expected {old!r} exactly {times} time(s), "
                     f"found it {found} times; is this Horovod 0.28.1?")
        changed = next(line for line in new.splitlines() if line not in old.splitlines())
        texts[path] = text.replace(old, new)
        notes.append(f"patch_horovod: {relative}: fixed ({changed.strip()})")
    for path, text in texts.items():
        path.write_text(text)
    print("\n".join(notes))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    apply_fixes(sys.argv[1])
