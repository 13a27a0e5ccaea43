"""The report's HTML page (python -m sample_fc.tools.report): one file that opens from disk, its
figures inlined as base64 PNGs, laid out as a dashboard. First the headline, a row of tiles per
run (state, steps, best and last accuracy per target, samples/s, wall time, the memory plan and
the measured peak); then the curves as small multiples (three across at 1280 px); then one table
of final numbers with a column per run (and, for several runs, each one's difference from the
first); then per run its facts (machine, world size, the memory plan and the sampling regime),
its config where it differs from its presets, its events. Every number of the final table
carries its exact value in data-value (JSON), for programs and tests.
"""
import datetime
import html
import json
import os

from ..config import config_for_run
from ..errors import UsageError

STYLE = ("body{font-family:sans-serif;margin:1em 2em;max-width:1400px} h1{font-size:1.4em;margin:.3em 0}"
         "table{border-collapse:collapse;margin:.5em 0 1.5em}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;font-size:90%}"
         "th{background:#f4f4f4} .note{color:#555;font-size:85%;margin:.2em 0 .6em}"
         ".headline{display:flex;flex-wrap:wrap;gap:6px;margin:0 0 10px;align-items:stretch}"
         ".tile{border:1px solid #ddd;border-radius:6px;padding:4px 10px;min-width:90px;background:#fafafa}"
         ".tile .label{font-size:75%;color:#666} .tile .value{font-size:125%;font-weight:bold}"
         ".run-name{font-weight:bold;align-self:center;min-width:120px}"
         ".done{color:#1a7f37} .training{color:#0969da} .stopped{color:#bc4c00} .failed{color:#cf222e}"
         ".curves{display:grid;grid-template-columns:repeat(3,minmax(0,1fr));gap:6px;margin-bottom:1em}"
         ".curves figure{margin:0} .curves img{width:100%;height:auto;display:block;border:1px solid #eee}")


def preset_config(config):
    """The config of the run's presets (config_for_run of its dataset, and of its network and loss
    where they are not the dataset's own: a loss named on the command line brings its published
    margins), or None when this version's presets cannot give it (a preset it does not know)."""
    try:
        dataset = config_for_run(config.get("dataset"))
        chosen = {k: config.get(k) for k in ("network", "loss") if config.get(k) != dataset.get(k)}
        return config_for_run(config.get("dataset"), chosen.get("network"), chosen.get("loss"))
    except UsageError:
        return None


def config_changes(config):
    """[(key, value, the preset's value)] of the keys whose value differs from the presets'
    (None when the presets are unknown: then every key)."""
    presets = preset_config(config) if config else None
    if presets is None:
        return None
    return [(k, v, presets[k]) for k, v in config.items() if k in presets and presets[k] != v]


def _when(seconds):
    return datetime.datetime.fromtimestamp(seconds).isoformat(sep=" ", timespec="seconds")


def wall_seconds(run):
    """Seconds from the first start to the last record written (None without times)."""
    times = [e["time"] for e in run.events] + [r["time"] for r in run.progress if "time" in r]
    starts = [e["time"] for e in run.of("start")]
    return max(times) - min(starts) if starts and times else None


def facts(run):
    """[(label, text)] of what the run is and where it ran."""
    status, starts = run.status, run.of("start")
    start = {k: v for e in starts for k, v in e.items()}      # the latest start's facts, earlier ones' where it
                                                              # has none
    wall = wall_seconds(run)
    rows = [("models root", os.path.abspath(run.root)),
            ("state", f"{status.get('state', 'unknown')} at step {status.get('step', '?')}"
                      + (f" (as of {status['updated']})" if status.get("updated") else "")),
            ("run id", status.get("run_id") or run.config.get("run_id", "")),
            ("dataset / network / loss",
             " / ".join(str(run.config.get(k, "?")) for k in ("dataset", "network", "loss"))),
            ("world size", start.get("world_size", status.get("world_size", ""))),
            ("machine", f"{start['host']}, {start['cores']} cores" if "host" in start else ""),
            ("started", _when(starts[0]["time"]) if starts else ""),
            ("wall time", str(datetime.timedelta(seconds=int(wall))) if wall is not None else ""),
            ("starts (resumes, restarts)", f"{len(starts)} (" + ", ".join(f"step {e['step']}" for e in starts) + ")"
             if starts else ""),
            ("memory plan", start.get("memory_plan", {}).get("summary", "")),
            ("sampling", start.get("sampling", {}).get("line", "")),
            ("sampling warning", start.get("sampling", {}).get("warning") or ""),
            ("last checkpoint", status.get("checkpoint") or ""),
            ("warning", status.get("warning") or ""),
            ("error", status.get("error") or "")]
    return [(label, text) for label, text in rows if text not in ("", None)]


def final_numbers(run):
    """{row label: value} of the run's last numbers (None: not recorded)."""
    last = run.progress[-1] if run.progress else {}
    checks = run.verifications()
    numbers = {"step": last.get("step"), "loss": last.get("loss"), "lr": last.get("lr"),
               "gradient norm": last.get("grad_norm"), "share clipped": last.get("clipped_share"),
               "samples/s": last.get("samples_per_s"),
               "best mean accuracy": run.best.get("mean_accuracy"), "best at step": run.best.get("step")}
    if checks:
        step, accuracy, tar, far = checks[-1]
        numbers["last verification step"] = step
        numbers.update({f"{t} accuracy": a for t, a in sorted(accuracy.items())})
        numbers.update({f"{t} TAR@FAR" + (f"={far:g}" if far else ""): v for t, v in sorted(tar.items())})
    numbers.update({"checkpoints written": len(run.of("checkpoint")), "skipped steps": len(run.of("skipped")),
                    "stops": len(run.of("stop")), "resumes / restarts": sum(e["step"] > 0 for e in run.of("start")),
                    "wall time (s)": round(wall_seconds(run), 1) if wall_seconds(run) is not None else None})
    return numbers


def _cell(value):
    if value is None:
        return "<td></td>"
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return f"<td data-value='{html.escape(json.dumps(value))}'>{html.escape(text)}</td>"


def _table(header, rows):
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    return f"<table><tr>{head}</tr>" + "".join(f"<tr>{''.join(rows_cells)}</tr>" for rows_cells in rows) + "</table>"


def numbers_table(runs):
    """One row per number, one column per run: the final numbers; with several runs, a column per
    later run with its difference from the first (where both are numbers)."""
    per_run = [final_numbers(run) for run in runs]
    labels = list(dict.fromkeys(label for numbers in per_run for label in numbers))

    def difference(label, numbers):
        first, other = per_run[0].get(label), numbers.get(label)
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (first, other))
        return _cell(round(other - first, 10)) if numeric else "<td></td>"
    rows = [[f"<th>{html.escape(label)}</th>"] + [_cell(numbers.get(label)) for numbers in per_run]
            + [difference(label, numbers) for numbers in per_run[1:]] for label in labels]
    header = [""] + [run.name for run in runs] + [f"{run.name} - {runs[0].name}" for run in runs[1:]]
    return _table(header, rows).replace("<table>", "<table id='final-numbers'>", 1)


def run_section(run):
    """The run's facts, config changes and events."""
    text = lambda value: f"<td>{html.escape(str(value))}</td>"   # noqa: E731
    parts = [f"<h2>{html.escape(run.name)}</h2>", _table(["", ""], [[f"<th>{html.escape(k)}</th>", text(v)]
                                                                     for k, v in facts(run)])]
    changes = config_changes(run.config)
    if changes is None:
        parts.append("<p class='note'>config: no config.json, or its presets are not in this repository's "
                     "default.py</p>")
    else:
        parts.append(f"<h3>config: {len(changes)} key(s) differ from the presets of "
                     f"{html.escape(' / '.join(str(run.config.get(k)) for k in ('dataset', 'network', 'loss')))}</h3>")
        if changes:
            parts.append(_table(["key", "this run", "preset"], [[text(k), text(repr(v)), text(repr(p))]
                                                                for k, v, p in changes]))
    for name, content in run.experiments:
        parts.append(f"<h3>--config file, kept as {html.escape(name)}</h3><pre>{html.escape(content)}</pre>")
    marks = [e for e in run.events if e["event"] not in ("verification", "start")] + [e for e in run.of("start")]
    if marks:
        rows = [[text(e["step"]), text(e["event"]), text(_when(e["time"])),
                 text(e.get("line") or e.get("signal") or e.get("path") or e.get("resumed_from") or "")]
                for e in sorted(marks, key=lambda e: (e["time"], e["step"]))]
        parts.append("<h3>events</h3>" + _table(["step", "event", "time", "detail"], rows))
    return "\n".join(parts)


def _tile(label, value, kind=""):
    return (f"<div class='tile'><div class='label'>{html.escape(label)}</div>"
            f"<div class='value {kind}'>{html.escape(str(value))}</div></div>")


def headline_tiles(run):
    """[(label, value, css class)] of the run's headline: state, steps, per target the best and
    last accuracy, samples/s (median of the last 5 progress lines), wall time, memory."""
    status, progress = run.status, run.progress
    state = status.get("state", "unknown")
    last_step = status.get("step", progress[-1]["step"] if progress else "?")
    tiles = [("state", state, state), ("steps", f"{last_step} / {run.config.get('max_update', '?')}", "")]
    checks = run.verifications()
    for target in sorted({t for check in checks for t in check[1]}):
        scored = [(step, accuracy[target]) for step, accuracy, _, _ in checks if target in accuracy]
        best = max(scored, key=lambda pair: pair[1])
        tiles.append((f"{target}: best (step) / last", f"{best[1]:.4f} ({best[0]}) / {scored[-1][1]:.4f}", ""))
    speeds = sorted(r["samples_per_s"] for r in progress[-5:] if isinstance(r.get("samples_per_s"), (int, float)))
    if speeds:
        tiles.append(("samples/s", f"{speeds[len(speeds) // 2]:.1f}", ""))
    wall = wall_seconds(run)
    if wall is not None:
        tiles.append(("wall time", str(datetime.timedelta(seconds=int(wall))), ""))
    plan = next((e["memory_plan"] for e in reversed(run.of("start")) if isinstance(e.get("memory_plan"), dict)), None)
    end = next((e for e in reversed(run.of("end")) if e.get("peak_rss_bytes")), None)
    if plan or end:
        planned = (sum(plan.get(k, 0) for k in ("bank", "sampler", "head", "backbone", "data", "runtime"))
                   if plan else None)
        peak = max(end["peak_rss_bytes"]) if end else None
        tiles.append(("memory per worker: plan / peak", " / ".join(f"{b / 1e9:.2f} GB" if b else "?"
                                                                   for b in (planned, peak)), ""))
    return tiles


def headline(runs):
    """One row of tiles per run (headline_tiles), the run's name first."""
    rows = []
    for run in runs:
        tiles = "".join(_tile(label, value, kind) for label, value, kind in headline_tiles(run))
        rows.append(f"<div class='headline'><div class='run-name'>{html.escape(run.name)}</div>{tiles}</div>")
    return "<section id='headline'>" + "".join(rows) + "</section>"


def html_page(runs, figures):
    """The page: the headline, the figures [(title, file name, base64 PNG)] three across, the
    final numbers, each run's facts."""
    names = ", ".join(run.name for run in runs)
    images = "".join(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(title)}' "
                     f"title='{html.escape(title)} ({html.escape(name)})'></figure>" for title, name, data in figures)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>sample_fc report: {html.escape(names)}</title>"
            f"<style>{STYLE}</style></head><body><h1>sample_fc report: {html.escape(names)}</h1>"
            f"<p class='note'>made {_when(datetime.datetime.now().timestamp())} by python -m sample_fc.tools.report; "
            f"a run still training shows what it has written so far</p>{headline(runs)}"
            + (f"<section id='curves' class='curves'>{images}</section>" if images
               else "<p>no progress records yet</p>")
            + f"<h2>final numbers</h2>{numbers_table(runs)}"
            + "\n".join(run_section(run) for run in runs) + "</body></html>")
