"""Benchmark pieces around the head: the data loader worker and the end-to-end train.py run.

The loader worker runs on every rank of a horovodrun job, each rank reading its own shard
with FaceRecordIter exactly as train.py builds it, so images/s is per rank while the other
rank loads too. The end-to-end run is train.py itself on synthetic data; its samples/s
come from ProgressLogger's lines. Started by `python -m sample_fc.bench`.
"""
import re
import sys
import tempfile
import time

PROGRESS_LINE = re.compile(r"step (\d+)/(\d+)\s+([0-9.]+) samples/s")


def data_case(rec, image_size, batch_size, num_batches, num_threads):
    """images/s of this rank's FaceRecordIter over `num_batches` batches after a warm-up batch."""
    from . import dist
    from .data import FaceRecordIter
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


def e2e_argv(repo, network, image_size, batch_size, num_classes, steps, frequent, models_root):
    """train.py's command line for a short synthetic run (no checkpoint before the last step)."""
    settings = {"image_size": image_size, "batch_size": batch_size, "num_classes": num_classes,
                "max_update": steps, "frequent": frequent, "verbose": 0,
                "ckpt_period": steps + 1, "ckpt_keep": 1}
    argv = [sys.executable, f"{repo}/train.py", "--dataset", "synthetic_1m", "--network", network,
            "--models-root", models_root]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def e2e_samples_per_s(output, warmup_windows=1):
    """Mean global samples/s of the progress windows after the first `warmup_windows`."""
    speeds = [float(match.group(3)) for match in PROGRESS_LINE.finditer(output)]
    if len(speeds) <= warmup_windows:
        raise ValueError(f"found {len(speeds)} progress lines, need more than {warmup_windows} "
                         "(the first is warm-up)")
    kept = speeds[warmup_windows:]
    return sum(kept) / len(kept), speeds


def e2e_case(repo, run_job, env, network, image_size, batch_size, num_classes, steps, frequent,
             world, timeout_s):
    """Run train.py on `world` workers; the record of the run (error field on failure)."""
    record = {"network": network, "world": world, "image_size": image_size,
              "batch_per_rank": batch_size, "classes": num_classes, "steps": steps}
    with tempfile.TemporaryDirectory(prefix="sample_fc_bench_e2e_") as models_root:
        argv = e2e_argv(repo, network, image_size, batch_size, num_classes, steps, frequent,
                        models_root)
        result = run_job(argv, num_proc=world, timeout_s=timeout_s, env=env, cwd=repo)
    record["seconds"] = result.seconds
    if result.timed_out or result.returncode != 0:
        reason = f"timed out after {timeout_s} s" if result.timed_out else f"exit code {result.returncode}"
        record["error"] = f"train.py {reason}: {result.output[-1500:]}"
        return record
    try:
        record["samples_per_s"], record["windows_samples_per_s"] = e2e_samples_per_s(result.stdout)
    except ValueError as error:
        record["error"] = f"{error}: {result.output[-1500:]}"
    return record
