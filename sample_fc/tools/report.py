"""A report of one or more training runs: one HTML page that opens from disk (its figures inlined
as PNG), and the figures beside it.

    python -m sample_fc.tools.report models/demo_mbf_small [--out DIR]
    python -m sample_fc.tools.report models/run_a models/run_b --out reports/a_vs_b

It reads what a run's models root holds (written by rank 0 while it trains; a run still
training is reported as far as it got): progress.jsonl (loss, lr, gradient norm, the share of
clipped steps, samples/s), events.jsonl (start with the run's facts, checkpoints,
verifications, skipped non-finite steps, the not-learning warning, stops, ends),
verification/<target>.npz (the latest verification's pairs: the ROC), status.json, best.json
and config.json. Figures: each quantity over steps with the events marked; each verification
target's accuracy and TAR@FAR over steps; the ROC of the latest verification. Several roots
are overlaid in one figure per quantity (the legend names them; events are marked on one run's
figures only, the table counts them) and compared in one table.
Default --out: ROOT/report for one root, <the roots' common parent>/report for several.
Lines of a jsonl file that are not whole records (a run killed mid-line) are left out, and one
line on stderr says which.
"""
import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from ..run.run_root import EVENTS_FILE, PROGRESS_FILE, STATUS_FILE, VERIFICATION_DIR, experiment_copies
from . import cli, plots
from .report_page import html_page

MAX_EXPERIMENT_CHARS = 20_000    # of a kept --config file shown in the report

# (progress key, title, y label, smoothed)
QUANTITIES = [("loss", "loss", "loss", True), ("samples_per_s", "training speed (global samples/s)", "samples/s", True),
              ("lr", "learning rate", "lr", False),
              ("grad_norm", "backbone gradient norm (before clipping)", "gradient norm", True),
              ("clipped_share", "share of steps whose gradient was clipped", "share clipped", True)]
# the figures in the order the dashboard shows them (the ROC last)
DASHBOARD_ORDER = ("loss.png", "verification_accuracy.png", "samples_per_s.png", "verification_tar.png", "lr.png",
                   "grad_norm.png", "clipped_share.png")


@dataclass
class Run:
    """What one models root holds."""
    name: str
    root: str
    config: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    best: dict = field(default_factory=dict)
    progress: list = field(default_factory=list)      # progress.jsonl's records, oldest first
    events: list = field(default_factory=list)        # events.jsonl's records
    pairs: dict = field(default_factory=dict)         # {target: (step, distances, issame)}
    experiments: list = field(default_factory=list)   # [(file name, text)]: the --config copies (run_root)

    def of(self, kind):
        return [e for e in self.events if e["event"] == kind]

    def marks(self):
        """[(step, kind)] of the events a step axis shows (a start after step 0: a resume)."""
        kinds = {"checkpoint", "stop", "skipped", "not_learning"}
        return ([(e["step"], e["event"]) for e in self.events if e["event"] in kinds]
                + [(e["step"], "restart") for e in self.of("start") if e["step"] > 0])

    def verifications(self):
        """[(step, {target: accuracy}, {target: TAR@FAR}, far)] oldest first; without events
        (a run from before them), the status's last verification."""
        found = [(e["step"], numbers_of(e.get("accuracy")), numbers_of(e.get("tar_at_far")),
                  e["far"] if is_number(e.get("far")) else None)
                 for e in self.of("verification")]
        last = self.status.get("verification")
        if not found and isinstance(last, dict) and is_number(last.get("step")):
            found = [(last["step"], numbers_of(last.get("accuracy")), {}, None)]
        return found


def numbers_of(mapping):
    """{name: number} of a recorded {target: value} (anything else left out)."""
    return {k: v for k, v in mapping.items() if is_number(v)} if isinstance(mapping, dict) else {}


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_json(path):
    """The JSON object in `path`, or {} when it is missing, unreadable or not an object."""
    try:
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def read_records(path, needs, complain):
    """The JSON objects of a jsonl file that have the keys `needs`, each a number but "event" (a
    missing file: []); complain(line) once about the lines that are not such records."""
    try:
        with open(path, errors="replace") as handle:
            lines = handle.read().split("\n")
    except OSError:
        return []
    records, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and all(k in record and (k == "event" or is_number(record[k])) for k in needs):
            records.append(record)
        else:
            bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
        complain(f"{path}: skipped {len(bad)} of {len(records) + len(bad)} lines that are not whole records "
                 f"(line{'s' if len(bad) > 1 else ''} {shown}: cut short or not JSON); the report shows the rest")
    return records


def read_pairs(root):
    """{target: (step, distances, issame)} from root/verification/*.npz (unreadable ones left out)."""
    folder, pairs = os.path.join(root, VERIFICATION_DIR), {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        if name.endswith(".npz") and not name.startswith("."):
            try:
                with np.load(os.path.join(folder, name)) as saved:
                    pairs[name[:-4]] = (int(saved["step"]), saved["distances"], saved["issame"])
            except (OSError, ValueError, KeyError):
                continue
    return pairs


def read_run(root, name, complain):
    """The Run in `root`; UsageError when it does not exist or holds no run."""
    if not os.path.isdir(root):
        raise UsageError(f"{root}: no such directory (give a models root: the --models-root of a run)")
    files = [os.path.join(root, f) for f in ("config.json", STATUS_FILE, PROGRESS_FILE, EVENTS_FILE)]
    if not any(os.path.isfile(f) for f in files):
        raise UsageError(f"{root}: holds no run (none of config.json, status.json, progress.jsonl, "
                         f"events.jsonl); give the --models-root of a run")
    run = Run(name, root, read_json(files[0]), read_json(files[1]), read_json(os.path.join(root, "best.json")))
    run.progress = read_records(files[2], ("step", "loss"), complain)
    run.events = read_records(files[3], ("step", "event", "time"), complain)
    run.pairs = read_pairs(root)
    for name, path in experiment_copies(root):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                run.experiments.append((name, f.read(MAX_EXPERIMENT_CHARS)))
        except OSError as error:
            complain(f"{path}: cannot read it ({error.strerror}); the report leaves it out")
    return run


def draw_figures(runs, out):
    """The report's PNGs in `out`: [(title, file name)], in the dashboard's order: the loss, the
    verification's accuracy, the speed, its TAR@FAR, the other quantities, the ROC."""
    one = len(runs) == 1
    figures = []
    for key, title, ylabel, smooth in QUANTITIES:
        series = [(run.name, *zip(*[(r["step"], r[key]) for r in run.progress if is_number(r.get(key))]))
                  for run in runs if any(is_number(r.get(key)) for r in run.progress)]
        if series:
            marks = runs[0].marks() if one else ()
            plots.step_figure(os.path.join(out, f"{key}.png"), title, ylabel, series, marks, log_y=key == "lr",
                              smooth=smooth)
            figures.append((title, f"{key}.png"))
    for index, (what, ylabel) in enumerate((("accuracy", "10-fold accuracy"), ("TAR@FAR", "TAR"))):
        series = []
        for run in runs:
            checks = run.verifications()
            targets = sorted({t for check in checks for t in check[1 + index]})
            series += [(t if one else f"{run.name}: {t}", *zip(*[(c[0], c[1 + index][t]) for c in checks
                                                                 if t in c[1 + index]])) for t in targets]
        if series:
            far = next((c[3] for run in runs for c in run.verifications() if c[3]), None)
            title = f"verification {what}" + (f" (FAR {far:g})" if index and far else "")
            name = "verification_accuracy.png" if index == 0 else "verification_tar.png"
            plots.step_figure(os.path.join(out, name), title, ylabel, series, runs[0].marks() if one else ())
            figures.append((title, name))
    figures.sort(key=lambda figure: DASHBOARD_ORDER.index(figure[1]))
    curves = [(f"{t} (step {step})" if one else f"{run.name}: {t} (step {step})", *plots.roc_points(-d, same))
              for run in runs for t, (step, d, same) in run.pairs.items()]
    if curves:
        plots.roc_figure(os.path.join(out, "roc.png"), curves, "ROC of the latest verification")
        figures.append(("ROC of the latest verification", "roc.png"))
    return figures


def default_out(roots):
    """ROOT/report for one root; the roots' common parent's report/ for several."""
    if len(roots) == 1:
        return os.path.join(roots[0], "report")
    return os.path.join(os.path.commonpath([os.path.dirname(os.path.abspath(r)) for r in roots]), "report")


def root_names(roots):
    """Each root's folder name, or its path as given when two share a name."""
    names = [os.path.basename(os.path.normpath(r)) for r in roots]
    return names if len(set(names)) == len(names) else [os.path.normpath(r) for r in roots]


def make_report(roots, out, complain):
    """Read the runs, draw the figures and write out/report.html; returns its path."""
    runs = [read_run(root, name, complain) for root, name in zip(roots, root_names(roots))]
    cli.check_output_dir(out, "--out")
    os.makedirs(out, exist_ok=True)
    figures = draw_figures(runs, out)
    path = os.path.join(out, "report.html")
    partial = path + ".partial"
    with open(partial, "w") as handle:
        handle.write(html_page(runs, [(title, name, plots.png_base64(os.path.join(out, name)))
                                      for title, name in figures]))
    os.replace(partial, path)
    return path, len(figures)


def main(argv=None):
    parser = cli.make_parser("sample_fc.tools.report", __doc__)
    parser.add_argument("roots", nargs="+", metavar="ROOT", help="models roots of runs (train.py's --models-root)")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="folder for report.html and its PNGs (default: ROOT/report; several roots: "
                             "their common parent's report/)")
    args = parser.parse_args(argv)

    def work():
        start = time.monotonic()
        complain = lambda line: print(f"{parser.prog}: {line}", file=sys.stderr, flush=True)  # noqa: E731
        path, count = make_report(args.roots, args.out or default_out(args.roots), complain)
        print(f"wrote {path} and {count} figures in {time.monotonic() - start:.1f} s", flush=True)
        return 0
    return cli.run_or_exit(parser, work)


if __name__ == "__main__":
    sys.exit(main())
