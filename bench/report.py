"""The benchmark report: machine facts, the memory model of a head case, the Markdown tables.

Pure Python (no mxnet import), so the orchestrator stays light.
"""
import datetime
import importlib.metadata
import math
import os
import platform
import subprocess



def meminfo_kb():
    """{field: kB} of /proc/meminfo (MemTotal, MemAvailable, ...)."""
    fields = {}
    with open("/proc/meminfo") as handle:
        for line in handle:
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
    return fields


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_model():
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _git_commit(repo):
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}{'+dirty' if dirty else ''}" if head else None


def machine_info(repo, mode):
    memory = meminfo_kb()
    return {"cpu": _cpu_model(), "cores": os.cpu_count(),
            "memory_gb": round(memory["MemTotal"] * 1024 / 1e9, 1),
            "mem_available_gb_at_start": round(memory["MemAvailable"] * 1024 / 1e9, 1),
            "python": platform.python_version(), "mxnet": _version("mxnet"),
            "numpy": _version("numpy"), "horovod": _version("horovod"),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "commit": _git_commit(repo), "mode": mode,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


# ---- memory of one head case, per rank -----------------------------------------------------
# Peak RSS of a head worker = its baseline (imports, Horovod: 155-165 MB measured) + the bank
# + the sampler's and host head's buffers (memory_plan.py) + a small slack.
BASELINE_MB = 200
SLACK = 1.03


# ---- Markdown ------------------------------------------------------------------------------
def _num(value, digits=1):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _cell(text, limit=160):
    """The first line of a message, safe inside a Markdown table cell."""
    lines = str(text).strip().splitlines() or [""]
    return lines[0].replace("|", "/")[:limit]


def _classes(count):
    return f"{count / 1e6:g}M" if count >= 1e6 else f"{count / 1e3:g}k"


def head_table(records):
    stages = []
    for record in records:
        stages += [name for name in record.get("stages", {}) if name not in stages]
    lines = ["| classes | ratio | world | bank | ms/step | samples/s | bound ms | x bound | peak RSS MB/rank "
             "| RSS / (base+bank+buffers) | " + " | ".join(f"{s} %" for s in stages) + " |",
             "|" + "---|" * (10 + len(stages))]
    for r in records:
        head = f"| {_classes(r['classes'])} | {r['ratio']:g} | {r['world']} | {r.get('dtype', 'float32')} "
        if "ms_per_step" not in r:
            note = r.get("error") or r.get("skipped") or "not run"
            lines.append(head + f"| {'skipped' if 'skipped' in r else 'error'}: {_cell(note)} |"
                         + " |" * (7 + len(stages)))
            continue
        shares = [100 * r["stages"].get(s, 0.0) / r["ms_per_step"] for s in stages]
        lines.append(head + f"| {_num(r['ms_per_step'])} | {_num(r['samples_per_s'], 0)} "
                     f"| {_num(r['bound_ms'])} | {_num(r['ratio_to_bound'], 2)} "
                     f"| {' / '.join(_num(x, 0) for x in r['peak_rss_mb_per_rank'])} "
                     f"| {_num(r['rss_ratio'], 2)} | " + " | ".join(_num(x, 0) for x in shares) + " |")
    return lines


def schedule_table(record):
    """The head step through the sampling warm-up: one row per quarter of it, one after it."""
    if not record:
        return []
    lines = ["", f"## Head step through the sampling warm-up: {_classes(record['classes'])} classes, world 1, "
             f"batch {record['batch_per_rank']}, ratio 1.0 to {record['ratio']:g} over {record['warmup_steps']} steps",
             ""]
    if "spans" not in record:
        return lines + [f"error: {_cell(record.get('error', 'not run'), 200)}"]
    lines += ["| steps | ratio | sampled rows | ms/step (median) | samples/s |", "|---|---|---|---|---|"]
    for span in record["spans"]:
        lines.append(f"| {span['first_update']}-{span['last_update']}{' (after)' if span['after_warmup'] else ''} "
                     f"| {_from_to(span, 'ratio', '{:.3g}')} | {_from_to(span, 'sampled', '{}')} "
                     f"| {_num(span['ms_per_step'])} "
                     f"| {_num(record['batch_per_rank'] * 1e3 / span['ms_per_step'], 0)} |")
    return lines


def _from_to(span, key, form):
    """`first to last` of a span's key_from/key_to, or the one value when they are equal."""
    first, last = span[f"{key}_from"], span[f"{key}_to"]
    return form.format(first) + ("" if last == first else " to " + form.format(last))


def targets(report):
    """[(target, measured, verdict)] for the targets of BENCHMARKS.md that this report covers."""
    rows = []
    head = {(r["classes"], r["ratio"], r["world"], r.get("dtype", "float32")): r for r in report["head"]}
    case = head.get((1_000_000, 0.1, 1, "float32"))
    if case and "ratio_to_bound" in case:
        rows.append(("head 1M, ratio 0.1, world 1 <= 1.5x NumPy bound",
                     f"{case['ratio_to_bound']:.2f}x", case["ratio_to_bound"] <= 1.5))
    half = head.get((1_000_000, 0.1, 1, "float16"))
    if case and half and "ms_per_step" in case and "ms_per_step" in half:
        slower = half["ms_per_step"] / case["ms_per_step"]
        rows.append(("head 1M, ratio 0.1, world 1: float16 bank <= 1.2x float32",
                     f"{half['ms_per_step']:.0f} vs {case['ms_per_step']:.0f} ms = {slower:.2f}x", slower <= 1.2))
    small = head.get((1_000_000, 0.1, 1, "float16+int8"))
    if case and small and "ms_per_step" in case and "ms_per_step" in small:
        slower = small["ms_per_step"] / case["ms_per_step"]
        rows.append(("head 1M, ratio 0.1, world 1: float16 + int8 momentum <= 1.2x float32",
                     f"{small['ms_per_step']:.0f} vs {case['ms_per_step']:.0f} ms = {slower:.2f}x", slower <= 1.2))
    for local, limit in ((1_250_000, 10), (4_400_000, 25)):
        measured = (report["sampler_ms"] or {}).get(str(local))
        if isinstance(measured, (int, float)):
            rows.append((f"sampler <= {limit} ms at {_classes(local)} local classes", f"{measured:.2f} ms",
                         measured <= limit))
    case = head.get((4_000_000, 0.1, 2, "float32"))
    if case:
        fits = "rss_ratio" in case
        measured = (f"peak {max(case['peak_rss_mb_per_rank']) / 1e3:.1f} GB/rank, {case['rss_ratio']:.2f}x"
                    if fits else _cell(case.get("error") or case.get("skipped", ""), 120))
        rows.append(("4M, 2 workers: fits in 24 GB, peak RSS <= 1.15x bank + buffers", measured,
                     fits and case["rss_ratio"] <= 1.15))
    data = report["data_images_per_s"] or {}
    mbf = [r for r in report["e2e"] if r["network"] == "mbf" and "samples_per_s" in r]
    loader = (data.get("by_size") or {}).get(str(mbf[0]["image_size"])) if mbf else None
    if mbf and isinstance(loader, (int, float)):
        need = mbf[0]["samples_per_s"] / mbf[0]["world"]
        rows.append((f"data loading >= 2x mbf consumption per rank ({mbf[0]['image_size']} px)",
                     f"{loader:.0f} img/s vs {need:.1f} img/s = {loader / need:.1f}x", loader >= 2 * need))
    return rows


def markdown(report):
    """The report as Markdown tables."""
    m = report["machine"]
    lines = [f"# sample_fc benchmark ({m['mode']}{', noisy' if m['mode'] == 'quick' else ''})", "",
             f"{m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; Python {m['python']}, mxnet "
             f"{m['mxnet']}, numpy {m['numpy']}, horovod {m['horovod']}; {m['date']}, commit "
             f"{m['commit']}; load average {m['load_average_at_start']} at start, "
             f"{m.get('load_average_at_end')} at end.", "",
             "## Head step (no backbone), per-rank batch 128, D 512", ""]
    lines += head_table(report["head"])
    lines += ["", "Stage columns: % of ms/step, each stage timed with every MXNet operation finished "
              "at both ends (steps alternating with the timed module.step)."]
    lines += schedule_table(report.get("schedule"))
    lines += ["", "## Sampler, 512 positives, ratio 0.1 (median ms)", "", "| local classes | ms |", "|---|---|"]
    for local, measured in (report["sampler_ms"] or {}).items():
        shown = f"{measured:.2f}" if isinstance(measured, (int, float)) else f"error: {_cell(measured.get('error'))}"
        lines.append(f"| {_classes(int(local))} | {shown} |")
    data = report["data_images_per_s"] or {}
    lines += ["", "## Data loader (FaceRecordIter on the demo set), images/s per rank, 2 ranks", "",
              "| image size | images/s per rank |", "|---|---|"]
    for size, value in (data.get("by_size") or {}).items():
        shown = _num(value, 0) if isinstance(value, (int, float)) else f"error: {_cell(value, 120)}"
        lines.append(f"| {size} px{' (headline)' if int(size) == data.get('headline_size') else ''} "
                     f"| {shown} |")
    lines += ["", "## End to end (train.py, synthetic data, 2 workers)", "",
              "| network | image | batch/rank | world | samples/s (global) |", "|---|---|---|---|---|"]
    for r in report["e2e"]:
        shown = (_num(r["samples_per_s"], 1) if "samples_per_s" in r
                 else f"error: {_cell(r.get('error', 'not run'), 120)}")
        lines.append(f"| {r['network']} | {r['image_size']} | {r['batch_per_rank']} | {r['world']} "
                     f"| {shown} |")
    rows = targets(report)
    if rows:
        lines += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {name} | {measured} | {'yes' if ok else 'NO'} |" for name, measured, ok in rows]
    return "\n".join(lines) + "\n"
