"""Benchmark of sample_fc on this machine: head step vs its NumPy bound, sampler, data, end to end.

    python -m bench [--quick] [--json OUT] [--markdown OUT] [--parts head,schedule,sampler,data,e2e]

Every measurement runs in a process of its own, bounded in time (world size 2 through
bench.harness.run_job = horovodrun; see bench_jobs); a case that fails, hangs or would
not fit in memory is reported with an `error` or `skipped` field and the report goes on.
`--quick` runs tiny shapes in well under a minute; BENCHMARKS.md describes the full run.
The workers are this module too: `python -m bench --worker {head,schedule,sampler,data,step}`
(step: bench/step_breakdown.py).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace

import numpy as np

from . import report as bench_report
from .jobs import REPO, e2e_case, make_demo_set, run_worker, worker_env, write_result


PARTS = ("head", "schedule", "sampler", "data", "e2e")


@dataclass(frozen=True)
class Plan:
    classes: tuple
    ratios: tuple
    worlds: tuple
    warmup: int                 # head steps before timing (the first builds oneDNN primitives)
    min_steps: int              # timed (module.step, staged step) pairs per head case: about
    max_steps: int              # budget_s worth of them, clamped to [min_steps, max_steps]
    budget_s: float
    bound_repeats: int          # NumPy GEMM / take+put repetitions (median)
    head_timeout_s: int         # per head case, all ranks
    sampler_repeats: int
    demo: dict                  # make_demo options besides the image size ({} = its defaults)
    data_sizes: tuple           # demo image sizes the loader reads
    data_batch: int
    data_batches: int           # timed batches per rank, after one warm-up batch
    e2e: tuple                  # (network, image_size, batch_per_rank, steps, frequent) per run
    e2e_classes: int
    e2e_timeout_s: int
    batch_per_rank: int = 128
    embedding_size: int = 512
    dtypes: tuple = ("float32", "float16", "float16+int8")   # bank storages of every head case (cases.bank_storage)
    sampler_locals: tuple = (1_250_000, 4_400_000)
    sampler_positives: int = 512
    sampler_ratio: float = 0.1
    data_threads: int = 2       # = the key table's data_threads
    schedule_classes: int = 1_000_000     # the head through the sampling warm-up, world 1: classes,
    schedule_ratio: float = 0.1           # the ratio after it (the config's warm-up starts at 1.0),
    schedule_warmup_steps: int = 40       # its length (a step's cost depends on its ratio only, so a
    schedule_after_steps: int = 10        # shorter warm-up than training's shows the same curve), steps after


QUICK = Plan(classes=(20_000,), ratios=(0.1,), worlds=(1, 2), warmup=2, min_steps=11, max_steps=13,
             budget_s=2.0, bound_repeats=3, head_timeout_s=120, sampler_repeats=10, sampler_locals=(1_250_000,),
             demo={"num_identities": 16, "images_per_identity": 16, "num_val_identities": 4,
                   "num_pairs": 20},
             data_sizes=(32, 112), data_batch=32, data_batches=8,
             e2e=(("mbf", 32, 8, 6, 2),), e2e_classes=1000, e2e_timeout_s=150,
             schedule_classes=20_000, schedule_warmup_steps=8, schedule_after_steps=4)
FULL = Plan(classes=(100_000, 1_000_000, 4_000_000), ratios=(1.0, 0.1), worlds=(1, 2), warmup=2,
            min_steps=3, max_steps=20, budget_s=40.0, bound_repeats=3, head_timeout_s=1800,
            sampler_repeats=50, demo={}, data_sizes=(32, 112), data_batch=128, data_batches=40,
            e2e=(("mbf", 112, 64, 8, 2), ("r50", 112, 16, 8, 2)), e2e_classes=100_000,
            e2e_timeout_s=1800)
HEADLINE_DATA_SIZE = 112       # the size of real training data (and of the full e2e runs)


# ---- the parts of the report ---------------------------------------------------------------
def _storage(label):
    from sample_fc.options import BANK_DTYPES, BANK_MOMENTA
    from .cases import bank_storage
    try:
        bank_storage(label)
    except ValueError:
        raise ValueError(f"{label!r} is not a bank storage: a dtype ({', '.join(BANK_DTYPES)}), optionally "
                         f"+ a momentum storage ({', '.join(BANK_MOMENTA)}), e.g. float16+int8") from None
    return label


def _ratio(text):
    value = float(text)
    if not 0 < value <= 1:
        raise ValueError(f"ratio {text!r} is not in (0, 1]")
    return value


def _world(text):
    value = int(text)
    if value < 1:
        raise ValueError(f"world {text!r} is not >= 1")
    return value


def head_record(plan, classes, ratio, world, dtype, folder, headroom):
    """One head case; skipped when its predicted memory (all ranks) exceeds headroom x
    MemAvailable right now."""
    record = {"classes": classes, "ratio": ratio, "world": world, "dtype": dtype}
    global_batch = plan.batch_per_rank * world
    per_rank = [head_memory_mb(plan, classes, ratio, world, dtype)] * world
    need_mb = sum(predicted for _, _, predicted in per_rank)
    available_mb = bench_report.meminfo_kb()["MemAvailable"] * 1024 / 1e6
    record["predicted_rss_mb_per_rank"] = round(need_mb / world)
    if need_mb > headroom * available_mb:
        record["skipped"] = (f"needs about {need_mb / 1e3:.1f} GB for {world} rank(s) (bank "
                             f"{sum(p[0] for p in per_rank) / 1e3:.1f} GB + step temporaries), more "
                             f"than {headroom:g} x MemAvailable {available_mb / 1e3:.1f} GB")
        return record
    options = {"classes": classes, "ratio": ratio, "dtype": dtype, "batch": plan.batch_per_rank,
               "dim": plan.embedding_size, "warmup": plan.warmup, "min_steps": plan.min_steps,
               "max_steps": plan.max_steps, "budget_s": plan.budget_s, "repeats": plan.bound_repeats}
    start = time.monotonic()
    ranks, error = run_worker("head", options, world, plan.head_timeout_s, folder)
    record["seconds"] = round(time.monotonic() - start, 1)
    if error:
        record["error"] = error
        return record
    first = ranks[0]
    bound_ms = sum(first["bound"].values())
    ratios = [r["peak_rss_mb"] / (r["baseline_rss_mb"] + bank + buffers)
              for r, (bank, buffers, _) in zip(ranks, per_rank)]
    record.update({
        "ms_per_step": first["ms_per_step"], "samples_per_s": global_batch / first["ms_per_step"] * 1e3,
        "bound_ms": bound_ms, "ratio_to_bound": first["ms_per_step"] / bound_ms,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in ranks),
        "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in ranks],
        "stages": first["stages"], "stage_sum_ms": sum(first["stages"].values()),
        "bound": first["bound"], "num_sampled": first["num_sampled"], "steps": first["steps"],
        "threads_per_rank": int(worker_env(world)["OMP_NUM_THREADS"]),
        "bank_mb": per_rank[0][0], "buffers_mb": per_rank[0][1],
        "baseline_rss_mb": first["baseline_rss_mb"], "rss_ratio": max(ratios),
        "bank_init_s": first["bank_init_s"]})
    return record


def head_memory_mb(plan, classes, ratio, world, dtype):
    """(bank, buffers, predicted peak RSS) in MB of the largest rank of a head case: the memory
    plan's bank, and its sampler and host head as the buffers (memory_plan.py)."""
    from sample_fc.pfc.head import default_threads
    from sample_fc.run.memory_plan import plan as memory_plan
    from .cases import bank_storage
    need = memory_plan(classes, world, plan.embedding_size, plan.batch_per_rank, ratio, bank_storage(dtype),
                       threads=default_threads(world))
    bank, buffers = need.bank / 1e6, (need.sampler + need.head) / 1e6
    return bank, buffers, bench_report.SLACK * (bench_report.BASELINE_MB + bank + buffers)


def schedule_record(plan, folder, buckets=4):
    """The head step through the sampling warm-up (world 1, float32 bank, corrected softmax):
    median ms of each quarter of the warm-up and of the steps after it."""
    options = {"classes": plan.schedule_classes, "ratio": plan.schedule_ratio, "batch": plan.batch_per_rank,
               "dim": plan.embedding_size, "warmup": plan.schedule_warmup_steps,
               "after-steps": plan.schedule_after_steps}
    record = {"classes": plan.schedule_classes, "ratio": plan.schedule_ratio,
              "warmup_steps": plan.schedule_warmup_steps, "batch_per_rank": plan.batch_per_rank}
    ranks, error = run_worker("schedule", options, 1, plan.head_timeout_s, folder)
    if error:
        return dict(record, error=error)
    steps, warmup = ranks[0]["steps"], plan.schedule_warmup_steps
    edges = [round(i * warmup / buckets) for i in range(buckets + 1)]
    spans = [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo] + [(warmup, len(steps))]
    record["spans"] = [{"first_update": steps[lo]["update"], "last_update": steps[hi - 1]["update"],
                        "ratio_from": steps[lo]["ratio"], "ratio_to": steps[hi - 1]["ratio"],
                        "sampled_from": steps[lo]["num_sampled"], "sampled_to": steps[hi - 1]["num_sampled"],
                        "ms_per_step": float(np.median([s["ms"] for s in steps[lo:hi]])),
                        "after_warmup": lo >= warmup} for lo, hi in spans]
    record["steps"] = steps
    return record


def sampler_record(plan, folder):
    """{local classes: median ms} of the sampler, one case per plan.sampler_locals."""
    measured = {}
    for local in plan.sampler_locals:
        options = {"classes": local, "positives": plan.sampler_positives,
                   "ratio": plan.sampler_ratio, "repeats": plan.sampler_repeats}
        ranks, error = run_worker("sampler", options, 1, 120, folder)
        measured[str(local)] = {"error": error} if error else ranks[0]["sampler_ms"]
    return measured


def data_record(plan, folder, world=2):
    by_size = {}
    for size in plan.data_sizes:
        rec, error = make_demo_set(folder, size, plan.demo)
        if error:
            by_size[str(size)] = error
            continue
        options = {"rec": rec, "image_size": size, "batch": plan.data_batch,
                   "batches": plan.data_batches, "threads": plan.data_threads}
        ranks, error = run_worker("data", options, world, 300, folder)
        by_size[str(size)] = error or sum(r["images_per_s"] for r in ranks) / len(ranks)
    headline = by_size.get(str(HEADLINE_DATA_SIZE))
    return {"headline_size": HEADLINE_DATA_SIZE,
            "headline": headline if isinstance(headline, float) else None,
            "by_size": by_size, "world": world, "batch_size": plan.data_batch,
            "threads_per_rank": plan.data_threads}


def e2e_records(plan, world=2):
    return [e2e_case(network, size, batch, plan.e2e_classes, steps, frequent, world, plan.e2e_timeout_s)
            for network, size, batch, steps, frequent in plan.e2e]


# ---- command lines -------------------------------------------------------------------------
def worker_main(argv):
    parser = argparse.ArgumentParser(prog="python -m bench --worker")
    parser.add_argument("--worker", required=True, choices=("head", "schedule", "sampler", "data", "step"))
    parser.add_argument("--out", required=True, help="result prefix: OUT.rank<r>.json")
    for name in ("classes", "batch", "dim", "warmup", "min-steps", "max-steps", "repeats",
                 "positives", "image-size", "batches", "threads", "after-steps", "steps"):
        parser.add_argument(f"--{name}", type=int)
    parser.add_argument("--ratio", type=float)
    parser.add_argument("--budget-s", type=float)
    parser.add_argument("--rec")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--network")
    args = parser.parse_args(argv)
    if args.worker == "head":
        from .cases import head_case
        record = head_case(args.classes, args.ratio, args.batch, args.dim, args.warmup, args.min_steps,
                           args.max_steps, args.budget_s, args.repeats, dtype=args.dtype)
    elif args.worker == "schedule":
        from .cases import schedule_case
        record = schedule_case(args.classes, args.ratio, args.batch, args.dim, args.warmup, args.after_steps)
    elif args.worker == "sampler":
        from .cases import sampler_case
        record = sampler_case(args.classes, args.positives, args.ratio, args.repeats)
    elif args.worker == "step":
        from .step_breakdown import step_case
        record = step_case(args.network, args.image_size, args.batch, args.steps)
    else:
        from .jobs import data_case
        record = data_case(args.rec, args.image_size, args.batch, args.batches, args.threads)
    write_result(args.out, record)
    if args.worker != "sampler":
        from sample_fc import dist
        dist.shutdown()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return worker_main(argv)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (30-40 s): checks the tool")
    parser.add_argument("--json", metavar="OUT", help="write the report as JSON")
    parser.add_argument("--markdown", metavar="OUT", help="write the report as Markdown tables")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS)} (default: all)")
    parser.add_argument("--classes", metavar="C1,C2", help="head cases' total classes (default: "
                        "the plan's: 100000,1000000,4000000; --quick: 20000)")
    parser.add_argument("--dtypes", metavar="S1,S2", help="head cases' bank storages (default: "
                        "float32,float16,float16+int8: float16 weights with an int8 momentum)")
    parser.add_argument("--ratios", metavar="R1,R2", help="head cases' sample ratios (default: 1.0,0.1)")
    parser.add_argument("--worlds", metavar="W1,W2", help="head cases' worker counts (default: 1,2)")
    parser.add_argument("--memory-headroom", type=float, default=0.97, metavar="F",
                        help="skip a head case whose predicted peak RSS (all ranks) exceeds F x "
                             "MemAvailable (default 0.97; near 1 risks the OOM killer)")
    args = parser.parse_args(argv)
    if not args.memory_headroom > 0:
        parser.error(f"--memory-headroom must be > 0, got {args.memory_headroom}")
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    plan, mode = (QUICK, "quick") if args.quick else (FULL, "full")
    if args.classes:
        try:
            classes = tuple(int(c) for c in args.classes.split(","))
        except ValueError:
            classes = ()
        if not classes or min(classes) < max(plan.worlds):
            parser.error(f"--classes must be comma-separated integers >= {max(plan.worlds)} "
                         f"(one class per rank at least), got {args.classes!r}")
        plan = replace(plan, classes=classes)
    for option, key, kind in (("--dtypes", "dtypes", _storage), ("--ratios", "ratios", _ratio),
                              ("--worlds", "worlds", _world)):
        text = getattr(args, key)
        if text:
            try:
                plan = replace(plan, **{key: tuple(kind(value) for value in text.split(","))})
            except ValueError as err:
                parser.error(f"{option}: {err}")
    report = {"head": [], "schedule": None, "sampler_ms": None, "data_images_per_s": None, "e2e": [],
              "machine": bench_report.machine_info(REPO, mode)}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sample_fc_bench_") as folder:
        if "head" in parts:
            for classes in plan.classes:
                for ratio in plan.ratios:
                    for world in plan.worlds:
                        for dtype in plan.dtypes:
                            report["head"].append(head_record(plan, classes, ratio, world, dtype, folder,
                                                              args.memory_headroom))
                            _progress(report["head"][-1], start)
        if "schedule" in parts:
            report["schedule"] = schedule_record(plan, folder)
            _progress({k: v for k, v in report["schedule"].items() if k != "steps"}, start)
        if "sampler" in parts:
            report["sampler_ms"] = sampler_record(plan, folder)
            _progress({"sampler_ms": report["sampler_ms"]}, start)
        if "data" in parts:
            report["data_images_per_s"] = data_record(plan, folder)
            _progress({"data_images_per_s": report["data_images_per_s"]["by_size"]}, start)
        if "e2e" in parts:
            report["e2e"] = e2e_records(plan)
            _progress({"e2e": [{k: r.get(k) for k in ("network", "samples_per_s", "error")}
                               for r in report["e2e"]]}, start)
    report["machine"].update({"load_average_at_end": [round(x, 2) for x in os.getloadavg()],
                              "total_seconds": round(time.monotonic() - start, 1)})
    text = bench_report.markdown(report)
    for path, content in ((args.json, json.dumps(report, indent=2) + "\n"), (args.markdown, text)):
        if path:
            with open(path, "w") as handle:
                handle.write(content)
    print(text)
    return 0


def _progress(record, start):
    shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in record.items()
             if k not in ("stages", "bound", "peak_rss_mb_per_rank")}
    print(f"[bench {time.monotonic() - start:6.1f}s] {json.dumps(shown)[:400]}", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
