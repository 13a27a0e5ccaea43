"""The user's launcher: `python -m sample_fc.launch ARGS` is horovodrun ARGS (what
./horovodrun.sh runs), with restarts on request. The launcher's rank, readable before Horovod
starts, is ranks.py's; the tests' and benchmarks' bounded jobs are harness.py's.
"""
import json
import os
import subprocess
import sys


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
    return run_commandline()


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
