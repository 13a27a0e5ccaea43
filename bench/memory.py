"""The memory plan against measured peaks: `python -m bench.memory [--quick] [--markdown OUT]`.

Each case is train.py itself, 6 steps on synthetic images under horovodrun (Gloo, local
workers), with a checkpoint and, where the case names pairs, verifications: the plan
is what the run planned (its events.jsonl start record), the peak each worker's resident memory at
the end of the run (the end record: every rank's VmHWM, after the checkpoint and the
verifications). A row gives plan / measured peak of the largest worker; the plan promises
[1.0, 1.25]. A case the plan refuses on this machine is a row saying so (train.py's own line).

    python -m bench.memory                      the matrix of docs/scale-and-memory.md
    python -m bench.memory --quick              three small cases, in about a minute
    python -m bench.memory --cases mbf:112:64:2 one case (network:px:batch:workers[:bank[:classes[:pairs]]])

A case with pairs > 0 trains on a demo set of `classes` identities at its image size
(sample_fc.data.demo, 4 images each) and verifies on its `pairs` held-out pairs after each step
(the verification's graph and the pair set's images in the plan); else on synthetic images.

Bank formats: float32 (weights and momentum), float16 (both), float16+int8 (8-bit momentum).
GPU memory is not measured here (no GPU on the machine this was written on): the plan's GPU
part is MXNet's graph plan without oneDNN's extra, stated as unmeasured in the docs.
"""
import argparse
import json
import os
import sys
import tempfile
import time

from .harness import run_job
from .jobs import REPO, worker_env
from sample_fc.run.run_root import read_events

GB = 1e9
PROMISE = (1.0, 1.25)        # plan / measured peak
BANKS = {"float32": {}, "float16": {"bank_dtype": "float16"},
         "float16+int8": {"bank_dtype": "float16", "bank_momentum": "int8"}}
# network, image size, batch per worker, workers, bank, classes[, verification pairs]: the docs' table
FULL = tuple((network, size, batch, world, "float32", 1000)
             for network, size, single, double in (("mbf_small", 32, (16, 64, 128), (64,)),
                                                   ("mbf", 32, (16, 64, 128), (64,)),
                                                   ("r50", 32, (16, 64), (16,)), ("r100", 32, (16, 64), (16,)),
                                                   ("mbf_small", 112, (16,), (64,)), ("mbf", 112, (16, 128), (64,)),
                                                   ("r50", 112, (16,), (16,)), ("r100", 112, (16,), ()))
             for world, batches in ((1, single), (2, double)) for batch in batches) + (
    ("mbf_small", 32, 64, 2, "float32", 4_000_000), ("mbf_small", 32, 64, 2, "float16", 4_000_000),
    ("mbf_small", 32, 64, 2, "float16+int8", 4_000_000), ("mbf_small", 32, 64, 2, "float32", 20_000),
    ("mbf_small", 32, 64, 2, "float32", 200, 600), ("mbf", 32, 128, 1, "float32", 1000, 2000),
    ("mbf", 112, 32, 2, "float32", 1000, 300), ("r50", 32, 64, 1, "float32", 200, 600),
    ("r100", 32, 16, 2, "float32", 200, 600),
)
QUICK = (("mbf_small", 32, 16, 1, "float32", 1000), ("mbf_small", 32, 32, 2, "float16+int8", 200_000),
         ("mbf_small", 32, 32, 2, "float32", 100, 200))


def case_argv(network, image_size, batch, bank, classes, models_root, rec=None, steps=6):
    """train.py's command line for a case: `steps` steps on synthetic images, or on the set `rec`
    verifying on its demo_val.bin after every step (a new inference graph each time, as in a
    long run); a checkpoint at the end."""
    settings = {"image_size": image_size, "batch_size": batch, "num_classes": classes, "max_update": steps,
                "frequent": 1, "ckpt_period": steps, "ckpt_keep": 1, "verify_period": 0, **BANKS[bank]}
    if rec:
        settings.update(rec=rec, val_targets='["demo_val"]', sample_ratio_warmup_steps=0, verify_period=1)
    argv = [sys.executable, os.path.join(REPO, "train.py"), "--dataset", "demo" if rec else "synthetic_1m",
            "--network", network, "--models-root", models_root]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def measure(case, timeout_s):
    """The record of one case: the plan's parts and total, every worker's peak, or why there is none."""
    network, image_size, batch, world, bank, classes, pairs = (tuple(case) + (0,))[:7]
    record = {"network": network, "image_size": image_size, "batch": batch, "world": world, "bank": bank,
              "classes": classes, "pairs": pairs}
    with tempfile.TemporaryDirectory(prefix="sample_fc_bench_memory_") as folder:
        root, rec = os.path.join(folder, "run"), None
        if pairs:
            from sample_fc.data.demo import make_demo
            make_demo(os.path.join(folder, "data"), num_identities=classes, images_per_identity=4,
                      num_val_identities=100, num_pairs=pairs, image_size=image_size)
            rec = os.path.join(folder, "data", "train.rec")
        start = time.monotonic()
        result = run_job(case_argv(network, image_size, batch, bank, classes, root, rec), world,
                         timeout_s=timeout_s, env=worker_env(world), cwd=REPO)
        record["seconds"] = round(time.monotonic() - start, 1)
        events = {record.get("event"): record for record in read_events(root)}     # the last of each kind
    refusal = [line for line in result.output.splitlines() if "train.py: error:" in line]
    if result.returncode == 2 and refusal:
        record["refused"] = refusal[0].split("train.py: error:", 1)[1].strip()
    elif result.timed_out or result.returncode != 0 or "end" not in events:
        record["error"] = (f"timed out after {timeout_s} s" if result.timed_out else
                           f"exit code {result.returncode}") + ": " + result.output[-1200:]
    else:
        plan = events["start"]["memory_plan"]
        record.update({"plan": {key: value for key, value in plan.items() if key != "summary"},
                       "planned_bytes": events["end"]["planned_bytes"],
                       "peak_bytes_per_worker": events["end"]["peak_rss_bytes"]})
        record["ratio"] = record["planned_bytes"] / max(record["peak_bytes_per_worker"])
    return record


def markdown(records, machine):
    """The docs' table: one row per case."""
    lines = [f"Measured {time.strftime('%Y-%m-%d')} on {machine} (`python -m bench.memory`): train.py, "
             "6 steps, a checkpoint (and a verification after each step where pairs are given); peak = the largest "
             "worker's VmHWM at the end.", "",
             "| network | px | batch | workers | bank | classes | val pairs | plan GB | peak GB | plan / peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        head = (f"| {r['network']} | {r['image_size']} | {r['batch']} | {r['world']} | {r['bank']} | "
                f"{r['classes']:,} | {r['pairs'] or '-'} |")
        if "ratio" in r:
            lines.append(f"{head} {r['planned_bytes'] / GB:.2f} | {max(r['peak_bytes_per_worker']) / GB:.2f} | "
                         f"{r['ratio']:.2f} |")
        else:
            lines.append(f"{head} - | - | {'refused: ' + r['refused'][:80] if 'refused' in r else 'failed'} |")
    return "\n".join(lines)


def parse_case(text):
    """network:px:batch:workers[:bank[:classes[:pairs]]] -> a case tuple."""
    parts = text.split(":")
    try:
        network, size, batch, world = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
        bank = parts[4] if len(parts) > 4 else "float32"
        classes = int(parts[5]) if len(parts) > 5 else 1000
        pairs = int(parts[6]) if len(parts) > 6 else 0
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(f"a case is network:px:batch:workers[:bank[:classes[:pairs]]], got {text!r}")
    if bank not in BANKS:
        raise argparse.ArgumentTypeError(f"bank {bank!r} is not one of {', '.join(BANKS)}")
    return network, size, batch, world, bank, classes, pairs


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="three small cases")
    parser.add_argument("--cases", nargs="+", type=parse_case, default=None, metavar="CASE",
                        help="network:px:batch:workers[:bank[:classes[:pairs]]] (default: the docs' matrix)")
    parser.add_argument("--json", default=None, metavar="OUT", help="write the records as JSON")
    parser.add_argument("--markdown", default=None, metavar="OUT", help="write the table as Markdown")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per case (default 1800)")
    args = parser.parse_args(argv)
    cases = args.cases or (QUICK if args.quick else FULL)
    records = []
    for case in cases:
        record = measure(case, args.timeout)
        records.append(record)
        print(json.dumps({k: v for k, v in record.items() if k != "plan"}), flush=True)
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    table = markdown(records, f"{os.cpu_count()} cores, {memory_gib:.0f} GiB")
    print(table)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(records, handle, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(table + "\n")
    outside = [r for r in records if "ratio" in r and not PROMISE[0] <= r["ratio"] <= PROMISE[1]]
    return 1 if outside or any("error" in r for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
