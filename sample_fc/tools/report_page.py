"""The report's HTML page (python -m sample_fc.tools.report): one file that opens from disk, its
figures inlined as base64 PNGs. Per run: its facts (state, machine, world size, wall time, the
memory plan and the sampling regime), its config where it differs from its presets, its events;
then one table of final numbers with a column per run. Every number of that table carries its
exact value in data-value (JSON), for programs and tests.
"""
import datetime
import html
import json
import os

from ..errors import UsageError

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px} table{border-collapse:collapse;margin:.5em 0 1.5em}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;font-size:90%}"
         "th{background:#f4f4f4} figure{display:inline-block;margin:0 1em 1em 0} figcaption{font-size:90%}"
         ".note{color:#555;font-size:90%}")


def preset_config(config):
    """The config of the run's presets (default.config_for_run of its dataset, and of its network
    and loss where they are not the dataset's own: a loss named on the command line brings its
    published margins), or None when the repository's default.py cannot give it."""
    try:
        import default          # installed beside the package (setup.py py_modules)
        dataset = default.config_for_run(config.get("dataset"))
        chosen = {k: config.get(k) for k in ("network", "loss") if config.get(k) != dataset.get(k)}
        return default.config_for_run(config.get("dataset"), chosen.get("network"), chosen.get("loss"))
    except (ImportError, UsageError):
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
    start = {k: v for e in starts for k, v in e.items()}      # the latest start's facts, earlier ones' where it has none
    wall = wall_seconds(run)
    rows = [("models root", os.path.abspath(run.root)),
            ("state", f"{status.get('state', 'unknown')} at step {status.get('step', '?')}"
                      + (f" (as of {status['updated']})" if status.get("updated") else "")),
            ("run id", status.get("run_id") or run.config.get("run_id", "")),
            ("dataset / network / loss", " / ".join(str(run.config.get(k, "?")) for k in ("dataset", "network", "loss"))),
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
    """One row per number, one column per run: the final numbers."""
    per_run = [final_numbers(run) for run in runs]
    labels = list(dict.fromkeys(label for numbers in per_run for label in numbers))
    rows = [[f"<th>{html.escape(label)}</th>"] + [_cell(numbers.get(label)) for numbers in per_run] for label in labels]
    return _table([""] + [run.name for run in runs], rows).replace("<table>", "<table id='final-numbers'>", 1)


def run_section(run):
    """The run's facts, config changes and events."""
    text = lambda value: f"<td>{html.escape(str(value))}</td>"   # noqa: E731
    parts = [f"<h2>{html.escape(run.name)}</h2>", _table(["", ""], [[f"<th>{html.escape(k)}</th>", text(v)]
                                                                     for k, v in facts(run)])]
    changes = config_changes(run.config)
    if changes is None:
        parts.append("<p class='note'>config: no config.json, or its presets are not in this repository's default.py</p>")
    else:
        parts.append(f"<h3>config: {len(changes)} key(s) differ from the presets of "
                     f"{html.escape(' / '.join(str(run.config.get(k)) for k in ('dataset', 'network', 'loss')))}</h3>")
        if changes:
            parts.append(_table(["key", "this run", "preset"], [[text(k), text(repr(v)), text(repr(p))]
                                                                for k, v, p in changes]))
    marks = [e for e in run.events if e["event"] not in ("verification", "start")] + [e for e in run.of("start")]
    if marks:
        rows = [[text(e["step"]), text(e["event"]), text(_when(e["time"])),
                 text(e.get("line") or e.get("signal") or e.get("path") or e.get("resumed_from") or "")]
                for e in sorted(marks, key=lambda e: (e["time"], e["step"]))]
        parts.append("<h3>events</h3>" + _table(["step", "event", "time", "detail"], rows))
    return "\n".join(parts)


def html_page(runs, figures):
    """The page: figures [(title, file name, base64 PNG)] first, then the numbers and each run."""
    names = ", ".join(run.name for run in runs)
    images = "".join(f"<figure><img src='data:image/png;base64,{data}' alt='{html.escape(title)}' width='640' "
                     f"height='480'><figcaption>{html.escape(title)} ({html.escape(name)})</figcaption></figure>"
                     for title, name, data in figures)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>sample_fc report: {html.escape(names)}</title>"
            f"<style>{STYLE}</style></head><body><h1>sample_fc report: {html.escape(names)}</h1>"
            f"<p class='note'>made {_when(datetime.datetime.now().timestamp())} by python -m sample_fc.tools.report; "
            f"a run still training shows what it has written so far</p>"
            f"{images or '<p>no progress records yet</p>'}<h2>final numbers</h2>{numbers_table(runs)}"
            + "\n".join(run_section(run) for run in runs) + "</body></html>")
