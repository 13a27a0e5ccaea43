"""Benchmark workers: the Partial FC head step (no backbone), its NumPy lower bound, the sampler.

Each worker runs in a process of its own (alone for world size 1, under horovodrun for 2),
so its peak RSS belongs to one case. The head is the real SampleDistributeModule with an
identity "backbone" (the data are the embeddings): `ms_per_step` times `module.step`, the
code a training step runs. The per-stage times come from `staged_step`: module.step with a
timer as its stage hook, mx.nd.waitall() between stages (test_bench pins that it computes
exactly what module.step computes). CPU only: the bound reads the bank's host
memory in place (memory_bank.host_view). Started by `python -m bench`.
"""
import contextlib
import resource
import time

import mxnet as mx
import numpy as np

from sample_fc import dist
from sample_fc.pfc.memory_bank import host_view
from sample_fc.module import SampleDistributeModule
from sample_fc.optimizers import BackboneOptimizer, WarmupMultiStepSchedule
from sample_fc.pfc.partial_fc import PartialFC, PartialFCOptions
from sample_fc.pfc.row_storage import Storage
from sample_fc.pfc.sampler import class_center_sample, num_sample_for, shard_range
from sample_fc.run.memory_plan import peak_rss_bytes

STAGES = ("forward", "allgather", "sample", "gather_rows", "logits", "softmax", "gradients", "finite_check",
          "reducescatter", "backbone_backward", "gradient_sum", "bank_update",
          "backbone_update")   # module.step's, in order
BOUND_BLOCK_ROWS = 512      # rows per take + put block of the rows-traffic bound
EMBEDDING_POOL = 4          # distinct embedding batches cycled through (labels differ every step)


def rss_mb():
    """(current RSS, peak RSS) of this process in MB (10**6 bytes); the peak is its own (VmHWM:
    memory_plan.peak_rss_bytes), not a spawning parent's."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() / 1e6, peak_rss_bytes() / 1e6


def median_ms(seconds):
    return float(np.median(seconds) * 1e3)


# ---- the head step -------------------------------------------------------------------------
def bank_storage(label):
    """The row_storage.Storage of a case's storage label: "float32", "float16", or a dtype with
    its momentum's storage, "float16+int8" (ValueError for other words)."""
    dtype, _, momentum = label.partition("+")
    return Storage(dtype, momentum or "same")


def build_head_module(classes, ratio, batch_size, embedding_size, rank, world, seed=0, lr=0.1, dtype="float32",
                      warmup_steps=0, sample_correction=False):
    """SampleDistributeModule over this rank's bank (stored as the label `dtype` says:
    bank_storage) with an identity backbone (no parameters); its sample ratio warms up from 1.0
    over `warmup_steps` updates."""
    schedule = WarmupMultiStepSchedule(lr)
    storage = bank_storage(dtype)
    options = PartialFCOptions(sample_ratio=ratio, sample_ratio_warmup_steps=warmup_steps,
                               sample_correction=sample_correction, bank_dtype=storage.weights,
                               bank_momentum=storage.momentum, seed=seed)
    partial_fc = PartialFC.for_rank(classes, rank, world, embedding_size, mx.cpu(), options, schedule)
    backbone = mx.sym.identity(mx.sym.Variable("data"), name="embeddings")
    backbone_optimizer = BackboneOptimizer(mx.optimizer.SGD(learning_rate=lr, lr_scheduler=schedule))
    module = SampleDistributeModule(backbone, partial_fc, backbone_optimizer, context=mx.cpu(),
                                    batch_size=batch_size, data_shape=(embedding_size,))
    module.init_params()
    return module


def make_batches(count, classes, batch_size, embedding_size, rank, seed=0):
    """`count` DataBatches: labels uniform over all classes, new every step; embeddings cycled."""
    rng = np.random.default_rng((seed, rank))
    pool = [mx.nd.array(rng.standard_normal((batch_size, embedding_size), dtype=np.float32))
            for _ in range(min(count, EMBEDDING_POOL))]
    return [mx.io.DataBatch(data=[pool[i % len(pool)]],
                            label=[mx.nd.array(rng.integers(0, classes, batch_size), dtype="int64")])
            for i in range(count)]


class StageTimer:
    """Wall time per named stage, with every pending MXNet operation finished at both ends."""

    def __init__(self):
        self.seconds = {}

    @contextlib.contextmanager
    def __call__(self, name):
        mx.nd.waitall()
        start = time.perf_counter()
        yield
        mx.nd.waitall()
        self.seconds[name] = time.perf_counter() - start


def staged_step(module, batch, timer):
    """SampleDistributeModule.step with `timer` as the module's stage hook: each block of the
    step timed, every MXNet operation finished at both ends. Returns the loss."""
    module.connect(stage_hook=timer)
    try:
        loss, skipped = module.step(batch)
    finally:
        module.connect()
    if skipped:
        raise FloatingPointError(f"non-finite loss or gradients at update {module.num_update + 1}")
    return loss


# ---- the lower bound -----------------------------------------------------------------------
def gemm_bound_ms(global_batch, num_sampled, embedding_size, repeats, seed=0):
    """Median ms of the step's three GEMMs with NumPy's BLAS on the step's shapes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((global_batch, embedding_size), dtype=np.float32)
    w = rng.standard_normal((num_sampled, embedding_size), dtype=np.float32)
    cosine = np.empty((global_batch, num_sampled), np.float32)
    grad_x = np.empty_like(x)
    grad_w = np.empty_like(w)
    gemms = {"gemm_logits": lambda: np.dot(x, w.T, out=cosine),           # (B x D)(D x K)
             "gemm_grad_x": lambda: np.dot(cosine, w, out=grad_x),        # (B x K)(K x D)
             "gemm_grad_w": lambda: np.dot(cosine.T, x, out=grad_w)}      # (K x B)(B x D)
    return {name: _median_call_ms(gemm, repeats) for name, gemm in gemms.items()}


def rows_traffic_ms(bank, index, repeats, block_rows=BOUND_BLOCK_ROWS):
    """Median ms of reading the sampled rows of every array the bank stores (weight, momentum;
    an int8 momentum's codes and scales) and writing them back (NumPy take + put through one
    cache-sized block each, so no K x D temporary is needed)."""
    index = np.sort(index)
    parts = []                  # (row block, its sampled rows, a buffer): split before the timing
    for blocks in bank.row_arrays().values():
        per_block = blocks[0].shape[0]                    # every block but the last holds as many rows
        buffer = np.empty((block_rows, blocks[0].shape[1]), dtype=blocks[0].dtype)
        for number, block in enumerate(blocks):
            start = number * per_block
            rows = index[(index >= start) & (index < start + block.shape[0])] - start
            parts.append((host_view(block), rows, buffer))

    def take_put():
        for array, mine, buffer in parts:
            for lo in range(0, len(mine), block_rows):
                rows = mine[lo:lo + block_rows]
                np.take(array, rows, axis=0, out=buffer[:len(rows)])
                array[rows] = buffer[:len(rows)]          # the same values back
    return _median_call_ms(take_put, repeats)


def _median_call_ms(function, repeats):
    function()                                   # warm-up: page faults, BLAS threads
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return median_ms(seconds)


# ---- the workers ---------------------------------------------------------------------------
def _timed_step(module, batch):
    """Seconds of one module.step, all its work finished."""
    start = time.perf_counter()
    module.step(batch)
    mx.nd.waitall()
    return time.perf_counter() - start


def head_case(classes, ratio, batch_size, embedding_size, warmup, min_steps, max_steps, budget_s,
              bound_repeats, dtype="float32"):
    """Measure one head case on this rank; returns the record of this rank (a dict)."""
    dist.init()
    rank, world = dist.rank(), dist.size()
    baseline_mb, _ = rss_mb()
    _, num_local = shard_range(classes, rank, world)
    num_sampled = num_sample_for(num_local, ratio)
    global_batch = batch_size * world
    dist.barrier("bench.gemm_bound")     # ranks share the machine: measure them together
    bound = gemm_bound_ms(global_batch, num_sampled, embedding_size, bound_repeats)

    start = time.perf_counter()
    module = build_head_module(classes, ratio, batch_size, embedding_size, rank, world, dtype=dtype)
    mx.nd.waitall()
    bank_init_s = time.perf_counter() - start
    batches = make_batches(warmup + 2 * max_steps, classes, batch_size, embedding_size, rank)
    warmup_seconds = [_timed_step(module, batch) for batch in batches[:warmup]]
    # every rank must run the same number of steps: agree on the slowest rank's estimate
    estimate = dist.allreduce_max(mx.nd.array([warmup_seconds[-1]]), "bench.step_estimate").asscalar()
    steps = int(min(max_steps, max(min_steps, budget_s / 2 / max(estimate, 1e-6))))
    step_seconds, stage_seconds = [], {name: [] for name in STAGES}
    for i in range(steps):           # interleaved, so both see the same machine load
        step_seconds.append(_timed_step(module, batches[warmup + 2 * i]))
        timer = StageTimer()
        staged_step(module, batches[warmup + 2 * i + 1], timer)
        for name in STAGES:
            stage_seconds[name].append(timer.seconds[name])
    _, index = class_center_sample(np.asarray([0]), num_local, num_sampled, rng=np.random.default_rng(0))
    dist.barrier("bench.rows_bound")
    bound["rows_take_put"] = rows_traffic_ms(module.partial_fc.bank, index, bound_repeats)
    current_mb, peak_mb = rss_mb()
    return {"rank": rank, "world": world, "classes": classes, "ratio": ratio, "dtype": dtype,
            "batch_per_rank": batch_size, "embedding_size": embedding_size,
            "num_local": num_local, "num_sampled": num_sampled, "steps": steps,
            "ms_per_step": median_ms(step_seconds),
            "stages": {name: median_ms(values) for name, values in stage_seconds.items()},
            "bound": bound, "bank_init_s": bank_init_s, "baseline_rss_mb": baseline_mb,
            "peak_rss_mb": peak_mb, "final_rss_mb": current_mb}


def schedule_case(classes, ratio, batch_size, embedding_size, warmup_steps, after_steps, sample_correction=True):
    """The head step through the sampling schedule on this rank: the ratio from 1.0 down to
    `ratio` over `warmup_steps` updates, then `after_steps` more. One record per step
    (update, ratio, sampled rows, ms); the first step also builds oneDNN's primitives, which
    the report's per-span medians absorb."""
    dist.init()
    rank, world = dist.rank(), dist.size()
    module = build_head_module(classes, ratio, batch_size, embedding_size, rank, world,
                               warmup_steps=warmup_steps, sample_correction=sample_correction)
    batches = make_batches(warmup_steps + after_steps, classes, batch_size, embedding_size, rank)
    sampled = []
    sampler = module.partial_fc.sampler

    def recording_sampler(labels, num_update=None):
        sample = sampler(labels, num_update)
        sampled.append(len(sample.index))
        return sample

    module.partial_fc.sampler = recording_sampler
    steps = []
    for batch in batches:
        seconds = _timed_step(module, batch)
        steps.append({"update": module.num_update,
                      "ratio": sampler.schedule(module.num_update) if sampler.schedule else ratio,
                      "num_sampled": sampled[-1], "ms": seconds * 1e3})
    return {"rank": rank, "world": world, "classes": classes, "ratio": ratio, "batch_per_rank": batch_size,
            "embedding_size": embedding_size, "warmup_steps": warmup_steps,
            "num_local": sampler.num_local, "sample_correction": sample_correction, "steps": steps}


def sampler_case(num_local, positives, ratio, repeats, seed=0):
    """Median ms of class_center_sample on one shard, `positives` distinct labels in the batch."""
    rng = np.random.default_rng(seed)
    num_sample = num_sample_for(num_local, ratio)
    label_sets = [rng.choice(num_local, positives, replace=False) for _ in range(repeats + 1)]
    seconds = []
    for labels in label_sets:
        start = time.perf_counter()
        class_center_sample(labels, num_local, num_sample, rng=rng)
        seconds.append(time.perf_counter() - start)
    return {"sampler_ms": median_ms(seconds[1:]), "num_local": num_local, "positives": positives,
            "ratio": ratio, "repeats": repeats}
