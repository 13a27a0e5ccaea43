"""The user's launcher: `python -m sample_fc.launch ARGS` is horovodrun ARGS (what
./horovodrun.sh runs), with restarts on request. The launcher's rank, readable before Horovod
starts, is ranks.py's; the tests' and benchmarks' bounded jobs are harness.py's.
"""
import json
import os
import subprocess
import sys
import tempfile
import uuid


def horovodrun_main():
    """`python -m sample_fc.launch [--max-restarts N [--min-workers M]] ARGS` = `horovodrun ARGS`
    under this interpreter; with --max-restarts, a failed job is restarted from its newest
    checkpoint (sample_fc.run.restart).

    The bootstrap builds horovodrun with scripts/patch_horovod.py's fixes: it passes the
    training command's options through untouched (no abbreviation matching, so
    `train.py --network r100` works) and a worker's error exit ends it with that worker's
    exit code and one line, not a traceback.
    """
    args, restart_options = sys.argv[1:], {"--max-restarts": None, "--min-workers": "1"}
    if args[:1] == ["--auto-layout"]:
        args = with_chosen_layout(args[1:])
    while args and args[0] in restart_options:
        if len(args) < 2 or not args[1].isdigit():
            sys.exit(f"sample_fc.launch: {args[0]} needs a whole number, got {args[1:2]}")
        restart_options[args[0]] = args[1]
        args = args[2:]
    if restart_options["--max-restarts"] is not None:
        from .restart import supervise
        horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
        return supervise([horovodrun] + args, int(restart_options["--max-restarts"]),
                         int(restart_options["--min-workers"]))
    from horovod.runner.launch import run_commandline
    sys.argv[0:] = ["horovodrun"] + args
    return saying_why_it_failed(run_commandline)


def saying_why_it_failed(run_job):
    """run_job() (horovodrun in this process; returns or exits with the job's code), the run
    told where to say where it lives (run_root.RUN_FILE_ENV, this attempt's id); when the job
    fails after its run started, the launcher's last line is the reason rank 0 recorded in the
    run's status.json, so the console says why even when no rank could (a rank killed, a native
    crash, a launcher that stopped forwarding output). A mistake (exit 2) was said before
    anything started; a stop on a signal is said by the run."""
    from . import run_root
    from .restart import failure_cause, read_run
    from ..errors import USAGE_EXIT
    with tempfile.TemporaryDirectory(prefix="sample_fc-launch-") as folder:
        run_file, attempt = os.path.join(folder, "run.json"), f"1-{uuid.uuid4().hex[:8]}"
        os.environ.update({run_root.RUN_FILE_ENV: run_file, run_root.ATTEMPT_ENV: attempt})
        try:
            code = run_job()
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        root, _, _, status = read_run(run_file, attempt)
        if code and code != USAGE_EXIT and root and (status or {}).get("state") != "stopped":
            print(f"horovodrun.sh: the job failed: {failure_cause(code, status)[0]} (the run: {root})",
                  file=sys.stderr, flush=True)
        return code


def with_chosen_layout(args):
    """horovodrun ARGS (`-np N -H localhost:N ... PYTHON TRAIN_PY [train.py arguments]`) with the
    layout `train.py --print-layout` chooses (sample_fc.run.layout): its -np, -H localhost:np and
    train.py arguments, its line to stderr. Nothing to train (-h, --print-config): ARGS as given.
    A mistake in the train.py arguments: train.py's one line and exit code."""
    at = next(i for i, arg in enumerate(args) if arg.endswith("train.py"))
    if {"-h", "--help", "--print-config", "--print-layout"} & set(args[at + 1:]):
        return args
    chosen = subprocess.run([sys.executable] + args[at:] + ["--print-layout"], capture_output=True, text=True)
    if chosen.returncode:
        sys.stderr.write(chosen.stderr)
        sys.exit(chosen.returncode)
    layout = json.loads(chosen.stdout)
    if layout["line"]:
        print(f"horovodrun.sh: {layout['line']}", file=sys.stderr, flush=True)
    args = list(args)
    args[args.index("-np") + 1] = str(layout["np"])
    args[args.index("-H") + 1] = f"localhost:{layout['np']}"
    return args + layout["train_args"]


if __name__ == "__main__":
    sys.exit(horovodrun_main())
