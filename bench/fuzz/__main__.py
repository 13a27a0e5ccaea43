"""Damaged inputs through every command that reads them.

    python -m bench.fuzz [--cases N] [--seed S] [--formats rec idx ...] [--commands verify ...]
        [--subprocess] [--work DIR] [--report fuzz.json] [--timeout S] [--old-checkpoints]

Builds the sound inputs once (in --work, default a temp dir; reused when there), makes N
damaged cases spread evenly over every (format, command) pair, runs them --lanes at a time
in worker processes that import MXNet once and call each command's main(argv) (train.py's
too: a single process, Horovod started and shut down per case, 2 steps; --subprocess: every
case as its own process, to confirm the in-process outcomes), prints cases per format x
command and outcome, and writes the failing cases to --report. Exit 1 when any case ended in
a traceback, a signal, a hang, a changed input or another exit code; 0 otherwise.
--old-checkpoints runs the cases on checkpoints as saved before checksums (COMPLETE {"step": N}).
"""
import argparse
import os
import sys
import tempfile
import time

from .cases import FORMATS, TOOL_MODULES, TRAIN_COMMANDS, make_cases
from .harness import Harness
from .inputs import build_inputs, old_checkpoint_inputs
from .report import failures, table, write_report


def make_parser():
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=200, help="damaged cases in all (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--formats", nargs="+", choices=sorted(FORMATS), default=None, help="default: all")
    parser.add_argument("--commands", nargs="+", choices=sorted(TOOL_MODULES) + list(TRAIN_COMMANDS), default=None,
                        help="default: every command that reads the formats")
    parser.add_argument("--subprocess", action="store_true", help="every case as its own process")
    parser.add_argument("--work", default=None, help="folder for the sound inputs and the cases (default: a temp dir)")
    parser.add_argument("--report", default="fuzz-report.json", help="JSON report of the failing cases")
    parser.add_argument("--timeout", type=float, default=120, help="seconds per tool case (train.py: twice)")
    parser.add_argument("--memory-gb", type=float, default=8, help="address space per process (default 8 GB)")
    parser.add_argument("--lanes", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep every case's folder (default: none)")
    parser.add_argument("--old-checkpoints", action="store_true",
                        help="checkpoints as saved before checksums: each COMPLETE only {\"step\": N}")
    parser.add_argument("--quiet", action="store_true", help="no line per failing case while running")
    return parser


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.cases < 1:
        make_parser().error(f"--cases must be >= 1, got {args.cases}")
    work = args.work or tempfile.mkdtemp(prefix="sample_fc-fuzz-")
    inputs = build_inputs(os.path.join(work, "inputs"), log=lambda line: print(line, file=sys.stderr))
    if args.old_checkpoints:
        inputs = old_checkpoint_inputs(inputs, os.path.join(work, "inputs-old-checkpoints"))
    cases = make_cases(inputs, args.cases, args.seed, args.formats, args.commands)
    started = time.monotonic()

    def progress(result, done):
        if not args.quiet and result["outcome"] not in ("ok", "usage"):
            print(f"[{done}/{len(cases)}] case {result['id']} {result['format']} {result['command']} "
                  f"{result['damage']}: {result['outcome']} ({(result['stderr_tail'] or [''])[-1][:160]})",
                  file=sys.stderr, flush=True)
        elif done % 50 == 0:
            print(f"[{done}/{len(cases)}] {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    harness = Harness(inputs, os.path.join(work, "cases"), args.timeout, args.memory_gb, args.subprocess,
                      args.keep, progress)
    results = harness.run(cases, args.lanes)
    seconds = time.monotonic() - started
    print("\n".join(table(results)))
    write_report(args.report, results, seconds, vars(args))
    failing = failures(results)
    print(f"{len(results)} cases in {seconds:.0f} s; {len(failing)} failing, listed in {args.report}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
