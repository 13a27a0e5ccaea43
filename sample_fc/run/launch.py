"""The user's launcher: `python -m sample_fc.launch ARGS` is horovodrun ARGS (what
./horovodrun.sh runs), with restarts on request. The launcher's rank, readable before Horovod
starts, is ranks.py's; the tests' and benchmarks' bounded jobs are harness.py's.
"""
import os
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


if __name__ == "__main__":
    sys.exit(horovodrun_main())
