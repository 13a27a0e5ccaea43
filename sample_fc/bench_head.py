"""Benchmark workers: the Partial FC head step (no backbone), its NumPy lower bound, the sampler.

Each worker runs in a process of its own (alone for world size 1, under horovodrun for 2),
so its peak RSS belongs to one case. The head is the real SampleDistributeModule with an
identity "backbone" (the data are the embeddings): `ms_per_step` times `module.step`, the
code a training step runs. The per-stage times come from `staged_step`, the same library
calls in the same order with mx.nd.waitall() between stages (test_bench pins that it
computes exactly what module.step computes). Started by `python -m sample_fc.bench`.
"""
import contextlib
import ctypes
import resource
import time

import mxnet as mx
import numpy as np

from . import dist
from .head import normalize_rows, normalize_rows_backward
from .margin import CombinedMargin
from .memory_bank import MemoryBank
from .module import SampleDistributeModule
from .sampler import as_int_labels, class_center_sample, num_sample_for, shard_range
from .softmax import margin_softmax_backward, margin_softmax_forward

STAGES = ("allgather", "sample", "gather_rows", "logits", "softmax", "gradients", "reducescatter",
          "finite_check", "bank_update")
EMBEDDING_POOL = 4          # distinct embedding batches cycled through (labels differ every step)


def rss_mb():
    """(current RSS, peak RSS) of this process in MB (10**6 bytes)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux
    return pages * resource.getpagesize() / 1e6, peak_kb * 1024 / 1e6


def median_ms(seconds):
    return float(np.median(seconds) * 1e3)


# ---- the head step -------------------------------------------------------------------------
def build_head_module(classes, ratio, batch_size, embedding_size, rank, world, seed=0, lr=0.1):
    """SampleDistributeModule over this rank's bank with an identity backbone (no parameters)."""
    import optimizer    # the repository's top-level optimizer.py (on sys.path, like train.py)
    schedule = optimizer.WarmupMultiStepSchedule(lr)
    bank = MemoryBank.for_rank(classes, rank, world, ratio, embedding_size, mx.cpu(), seed=seed)
    backbone = mx.sym.identity(mx.sym.Variable("data"), name="embeddings")
    backbone_optimizer = optimizer.DistributedOptimizer(
        mx.optimizer.SGD(learning_rate=lr, lr_scheduler=schedule))
    module = SampleDistributeModule(backbone, CombinedMargin(), bank,
                                    optimizer.MemoryBankSGDOptimizer(schedule), backbone_optimizer,
                                    mx.cpu(), batch_size, (embedding_size,))
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
    """SampleDistributeModule.step for an identity backbone, one timed block per stage.

    The same calls as module.backward_all with head_forward_backward split into its stages,
    then the module's own step_is_finite and update, in the order module.step makes them
    (the identity backbone has nothing to run). Returns the loss.
    """
    bank, ctx, margin = module.bank, module.bank.ctx, module.margin
    labels = as_int_labels(batch.label[0])
    with timer("allgather"):         # 2. the global batch: embeddings (B x D), integer labels (B)
        all_embeddings = module.allgather(batch.data[0].as_in_context(ctx), "embeddings")
        all_labels = dist.allgather(mx.nd.array(labels, dtype="int64"), "labels").asnumpy()
    with timer("sample"):            # 3. all local positives + uniform negatives
        target, index = bank.sample(all_labels)
        index = bank.index_array(index)
        target = mx.nd.array(target, ctx=ctx, dtype="int64")
    with timer("gather_rows"):       # 4. the sampled rows of weight and momentum
        weight_rows, momentum_rows = bank.get(index)
    with timer("logits"):            # 5. cosine GEMM of the normalised rows
        x_hat, x_norms = normalize_rows(all_embeddings)
        w_hat, w_norms = normalize_rows(weight_rows)
        cosine = mx.nd.FullyConnected(x_hat, w_hat, no_bias=True, num_hidden=weight_rows.shape[0])
    with timer("softmax"):           # 6-8. margin, exact distributed softmax, d loss / d cosine
        loss_rows, cache = margin_softmax_forward(cosine, target, margin, dist.allreduce_max,
                                                  dist.allreduce_sum)
        loss = mx.nd.sum(loss_rows) / len(all_labels)
        grad_rows = mx.nd.full(loss_rows.shape, 1.0 / len(all_labels), ctx=ctx, dtype=cosine.dtype)
        grad_cosine = margin_softmax_backward(cache, grad_rows)
    with timer("gradients"):         # 8. two GEMMs and the normalisation backward
        grad_x_hat = mx.nd.dot(grad_cosine, w_hat)
        grad_w_hat = mx.nd.dot(grad_cosine, x_hat, transpose_a=True)
        grad_all_embeddings = normalize_rows_backward(grad_x_hat, x_hat, x_norms)
        grad_weight_rows = normalize_rows_backward(grad_w_hat, w_hat, w_norms)
    with timer("reducescatter"):     # 9. this rank's rows of d loss / d embeddings
        dist.reducescatter_sum(grad_all_embeddings, "embedding_grads")
    # what backward_all leaves for update(), exactly as it does
    module._pending_bank_update = (index, weight_rows, momentum_rows, grad_weight_rows)
    with timer("finite_check"):      # loss and gradients finite on every rank (one allreduce)
        finite = module.step_is_finite(loss)
    if not finite:
        raise FloatingPointError(f"non-finite loss or gradients at update {module.num_update + 1}")
    with timer("bank_update"):       # 10. SGD-momentum on the sampled rows, written back
        module.update()
    return loss


# ---- the lower bound -----------------------------------------------------------------------
def numpy_view(array):
    """A NumPy float32 array sharing a CPU NDArray's memory (no copy; benchmark use only)."""
    array.wait_to_read()
    pointer = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    buffer = (ctypes.c_float * array.size).from_address(pointer.value)
    return np.frombuffer(buffer, dtype=np.float32).reshape(array.shape)


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


def rows_traffic_ms(bank, index, repeats):
    """Median ms of a NumPy take + put of the sampled rows of weight and of momentum."""
    weight, momentum = numpy_view(bank.weight), numpy_view(bank.momentum)

    def take_put():
        weight_rows, momentum_rows = np.take(weight, index, axis=0), np.take(momentum, index, axis=0)
        weight[index], momentum[index] = weight_rows, momentum_rows     # the same values back
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
def head_case(classes, ratio, batch_size, embedding_size, warmup, min_steps, max_steps, budget_s,
              bound_repeats):
    """Measure one head case on this rank; returns the record of this rank (a dict)."""
    dist.init()
    rank, world = dist.rank(), dist.size()
    baseline_mb, _ = rss_mb()
    _, num_local = shard_range(classes, rank, world)
    num_sampled = num_sample_for(num_local, ratio)
    global_batch = batch_size * world
    bound = gemm_bound_ms(global_batch, num_sampled, embedding_size, bound_repeats)

    start = time.perf_counter()
    module = build_head_module(classes, ratio, batch_size, embedding_size, rank, world)
    mx.nd.waitall()
    bank_init_s = time.perf_counter() - start
    batches = make_batches(warmup + 2 * max_steps, classes, batch_size, embedding_size, rank)
    step_seconds, stage_seconds = [], {name: [] for name in STAGES}
    for batch in batches[:warmup]:
        start = time.perf_counter()
        module.step(batch)
        mx.nd.waitall()
        step_seconds.append(time.perf_counter() - start)
    # every rank must run the same number of steps: agree on the slowest rank's estimate
    estimate = dist.allreduce_max(mx.nd.array([step_seconds[-1]]), "bench.step_estimate").asscalar()
    steps = int(min(max_steps, max(min_steps, budget_s / 2 / max(estimate, 1e-6))))
    step_seconds = []
    for i in range(steps):           # interleaved, so both see the same machine load
        step_batch, staged_batch = batches[warmup + 2 * i], batches[warmup + 2 * i + 1]
        start = time.perf_counter()
        module.step(step_batch)
        mx.nd.waitall()
        step_seconds.append(time.perf_counter() - start)
        timer = StageTimer()
        staged_step(module, staged_batch, timer)
        for name in STAGES:
            stage_seconds[name].append(timer.seconds[name])
    _, index = class_center_sample(np.asarray([0]), num_local, num_sampled, rng=np.random.default_rng(0))
    bound["rows_take_put"] = rows_traffic_ms(module.bank, index, bound_repeats)
    current_mb, peak_mb = rss_mb()
    return {"rank": rank, "world": world, "classes": classes, "ratio": ratio,
            "batch_per_rank": batch_size, "embedding_size": embedding_size,
            "num_local": num_local, "num_sampled": num_sampled, "steps": steps,
            "ms_per_step": median_ms(step_seconds),
            "stages": {name: median_ms(values) for name, values in stage_seconds.items()},
            "bound": bound, "bank_init_s": bank_init_s, "baseline_rss_mb": baseline_mb,
            "peak_rss_mb": peak_mb, "final_rss_mb": current_mb}


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
