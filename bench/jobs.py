"""Benchmark jobs: bounded worker processes, the data loader worker, the end-to-end train.py run.

Every measurement runs in a process of its own, killed after its time bound: alone for
world size 1, under horovodrun (bench.harness.run_job) for more. Workers write one JSON
record per rank. The loader worker runs on every rank, each reading its own shard with
FaceRecordIter as train.py builds it, so images/s is per rank while the other rank loads
too. The end-to-end run is train.py itself on synthetic data; its samples/s come from its
models root's progress records (run_root.read_progress). This module imports no mxnet until a worker runs.
"""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .harness import run_job, single_thread_env
from sample_fc.ranks import cores_per_worker
from sample_fc.run.run_root import read_progress

REPO = str(Path(__file__).resolve().parents[1])   # the repository: train.py lives here


# ---- bounded processes ---------------------------------------------------------------------
def worker_env(world):
    """Each rank gets cores // world BLAS/OpenMP threads (the whole machine at world 1)."""
    threads = str(cores_per_worker(world))
    env = single_thread_env({"OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads,
                             "MKL_NUM_THREADS": threads})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return env


def run_worker(kind, options, world, timeout_s, folder):
    """Run `python -m bench --worker kind` on `world` ranks.

    Returns (per-rank records, None), or (None, error message) when the job failed, hung
    or left a rank's record missing.
    """
    prefix = os.path.join(tempfile.mkdtemp(prefix=f"{kind}-", dir=folder), "result")
    argv = [sys.executable, "-m", "bench", "--worker", kind, "--out", prefix]
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    result = run_job(argv, world, timeout_s=timeout_s, env=worker_env(world), cwd=REPO)
    if result.timed_out:
        return None, f"timed out after {timeout_s} s: {result.output[-1500:]}"
    paths = [f"{prefix}.rank{r}.json" for r in range(world)]
    if result.returncode != 0 or not all(os.path.exists(p) for p in paths):
        return None, f"exit code {result.returncode}: {result.output[-1500:]}"
    records = []
    for path in paths:
        with open(path) as handle:
            records.append(json.load(handle))
    return records, None


def write_result(path_prefix, record):
    """Write a worker's record to PREFIX.rank<r>.json (r = record['rank'], default 0)."""
    with open(f"{path_prefix}.rank{record.get('rank', 0)}.json", "w") as handle:
        json.dump(record, handle)


# ---- data loader ---------------------------------------------------------------------------
def data_case(rec, image_size, batch_size, num_batches, num_threads):
    """images/s of this rank's FaceRecordIter over `num_batches` batches after a warm-up batch."""
    from sample_fc import dist
    from sample_fc.data import FaceRecordIter
    dist.init()
    rank, world = dist.rank(), dist.size()
    loader = FaceRecordIter(rec, batch_size, (3, image_size, image_size), rank=rank,
                            num_workers=world, num_threads=num_threads)
    try:
        _next_batch(loader).data[0].wait_to_read()         # warm-up: threads, page cache
        start = time.perf_counter()
        for _ in range(num_batches):
            _next_batch(loader).data[0].wait_to_read()
        seconds = time.perf_counter() - start
    finally:
        loader.close()
    return {"rank": rank, "world": world, "image_size": image_size, "batch_size": batch_size,
            "batches": num_batches, "num_threads": num_threads,
            "images_per_s": num_batches * batch_size / seconds}


def _next_batch(loader):
    try:
        return loader.next()
    except StopIteration:
        loader.reset()
        return loader.next()


def make_demo_set(folder, image_size, demo_options, timeout_s=900):
    """Write a demo set with `python -m sample_fc.tools.demo_data`; (train.rec path, None) or (None, error)."""
    out = os.path.join(folder, f"demo{image_size}")
    argv = [sys.executable, "-m", "sample_fc.tools.demo_data", "--out", out, "--image-size", str(image_size)]
    for key, value in demo_options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    result = run_job(argv, 1, timeout_s=timeout_s, env=worker_env(1), cwd=REPO)
    if result.timed_out or result.returncode != 0:
        return None, f"make_demo failed (exit {result.returncode}): {result.output[-800:]}"
    return os.path.join(out, "train.rec"), None


# ---- end to end ----------------------------------------------------------------------------
def e2e_argv(network, image_size, batch_size, num_classes, steps, frequent, models_root):
    """train.py's command line for a short synthetic run (no checkpoint before the last step)."""
    settings = {"image_size": image_size, "batch_size": batch_size, "num_classes": num_classes,
                "max_update": steps, "frequent": frequent, "verify_period": 0,
                "ckpt_period": steps + 1, "ckpt_keep": 1}
    argv = [sys.executable, os.path.join(REPO, "train.py"), "--dataset", "synthetic_1m",
            "--network", network, "--models-root", models_root]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def e2e_samples_per_s(records, warmup_windows=1):
    """(mean global samples/s of the progress windows after the first `warmup_windows`,
    all windows' samples/s), from a run's progress records."""
    speeds = [float(record["samples_per_s"]) for record in records]
    if len(speeds) <= warmup_windows:
        raise ValueError(f"found {len(speeds)} progress records, need more than {warmup_windows} "
                         "(the first is warm-up)")
    kept = speeds[warmup_windows:]
    return sum(kept) / len(kept), speeds


def e2e_case(network, image_size, batch_size, num_classes, steps, frequent, world, timeout_s):
    """Run train.py on `world` workers; the record of the run (error field on failure)."""
    record = {"network": network, "world": world, "image_size": image_size,
              "batch_per_rank": batch_size, "classes": num_classes, "steps": steps}
    with tempfile.TemporaryDirectory(prefix="sample_fc_bench_e2e_") as models_root:
        argv = e2e_argv(network, image_size, batch_size, num_classes, steps, frequent, models_root)
        result = run_job(argv, world, timeout_s=timeout_s, env=worker_env(world), cwd=REPO)
        progress = read_progress(models_root)
    record["seconds"] = round(result.seconds, 1)
    if result.timed_out or result.returncode != 0:
        reason = f"timed out after {timeout_s} s" if result.timed_out else f"exit code {result.returncode}"
        record["error"] = f"train.py {reason}: {result.output[-1500:]}"
        return record
    try:
        record["samples_per_s"], record["windows_samples_per_s"] = e2e_samples_per_s(progress)
    except ValueError as error:
        record["error"] = f"{error}: {result.output[-1500:]}"
    return record
