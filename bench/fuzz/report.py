"""The fuzz run's table (cases per format x command and outcome) and its JSON report."""
import collections
import json

from .cases import FORMATS
from .outcomes import FAILURES, OUTCOMES


def table(results):
    """Lines: one row per (format, command) with its count of each outcome, and a total row."""
    counts = collections.defaultdict(collections.Counter)
    for result in results:
        counts[result["format"], result["command"]][result["outcome"]] += 1
    header = f"{'format':<11} {'command':<17}" + "".join(f"{name:>14}" for name in OUTCOMES)
    lines = [header, "-" * len(header)]
    total = collections.Counter()
    for (fmt, command), counter in sorted(counts.items(), key=lambda item: (list(FORMATS).index(item[0][0]),
                                                                           item[0][1])):
        total.update(counter)
        lines.append(f"{fmt:<11} {command:<17}" + "".join(f"{counter[name]:>14}" for name in OUTCOMES))
    lines.append("-" * len(header))
    lines.append(f"{'all':<11} {len(results):<17}" + "".join(f"{total[name]:>14}" for name in OUTCOMES))
    return lines


def failures(results):
    return [r for r in results if r["outcome"] in FAILURES]


def write_report(path, results, seconds, arguments):
    """JSON: the run's arguments, counts, every case's outcome and exit code ({id: [outcome,
    code]}: an in-process and a --subprocess run of the same seed compare case by case), and
    every failing case (format, command, damage, seed, id, file, stderr's last lines),
    checkpoint-package cases marked."""
    failing = failures(results)
    report = {"arguments": arguments, "cases": len(results), "seconds": round(seconds, 1),
              "counts": dict(collections.Counter(r["outcome"] for r in results)),
              "outcomes": {r["id"]: [r["outcome"], r["code"]] for r in results},
              "failures": [dict(r, checkpoint_package=FORMATS[r["format"]].checkpoint or
                                r["command"] == "train_resume") for r in failing]}
    with open(path, "w") as handle:
        json.dump(report, handle, indent=1)
    return report
