"""The head of one step: its contract (Head), which both kernels implement, and the host kernel
(HostHead), the one a bank in host memory runs (the default CPU bank); the device kernel is
device_head.py (MXNet operators on the bank's context).

HostHead: steps 4-8 and 10 of docs/DESIGN.md (gather, cosine, margin softmax, gradients, bank update),
laid out for a CPU on NumPy's BLAS. On this machine's class of CPU NumPy's BLAS runs the step's
GEMMs 2-3x faster than mx.nd.dot, and the K x D passes, not the B x K ones, are what cost:
- no K x D array is normalised: 1/|w_k| scales the B x K cosines and gradients instead,
  and the radial part of the normalisation backward, <d w_hat_k, w_hat_k>, is the column
  sum of grad_cosine * cosine over the B rows;
- the sampled rows land in one reused K x D buffer (at ratio 1.0 the bank itself is used);
- the gradient of the bank rows is never held whole: the update walks blocks of rows that
  fit in cache (gradient block by GEMM, SGD-momentum, write-back);
- no one-hot matrix: the margin touches only the B target entries.
The margin is margin.py's formula on NumPy arrays, the update MemoryBankSGDOptimizer's.
Rows are read as float32 and written back as the bank stores them (row_storage.HostRows:
float16 rows and int8 momentum with stochastic rounding, no momentum for bank_momentum=none);
this module never branches on the format.
Used for CPU banks by SampleDistributeModule; GPU banks run device_head.py.
"""
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import numpy as np
from threadpoolctl import ThreadpoolController

from ..ranks import cores_per_worker

NORM_EPS = 1e-12


def no_stage(name):
    """The default `stage`: names a block of the step and does nothing (a benchmark passes
    a timer with the same signature to time each block)."""
    return contextlib.nullcontext()


class Head:
    """The head of one rank: steps 4-8 and 10 of a step (docs/DESIGN.md) on its MemoryBank.
    Both kernels implement this contract: HostHead (below, NumPy BLAS on a bank in host memory)
    and DeviceHead (device_head.py, MXNet operators on the bank's context), pinned to the same
    NumPy reference by tests/test_host_head.py and tests/test_module.py.

    forward_backward(embeddings, sample, total_rows, margin) -> (loss, grad_embeddings)
        embeddings: (B, D) NDArray, the global batch; sample: this shard's sampler.Sample (the
        sorted rows `index`, each row's position `targets`, and the sampling policy's
        logit_offsets and decay_scales, each None when off); total_rows: B, the rows the loss is
        averaged over; margin: this step's margin (pfc/margin.py's interface; PartialFC decides it).
        Returns the global mean loss ((1,) NDArray) and d loss / d embeddings ((B, D) NDArray
        on the embeddings' context, this rank's columns only: to be summed over ranks). What
        the bank update needs is kept until update() or discard().
    update(num_update): 10. `optimizer`'s update (MemoryBankSGDOptimizer) on rows sample.index
        only, each row decayed as sample.decay_scales says, written back to the bank;
        num_update is 1-based.
    discard(): forget the kept update (a skipped step).
    workspace_bytes(num_sampled, global_batch, embedding_size, ...): the step's temporaries
        (the memory plan's `head` term).

    allreduce_max / allreduce_sum(array, name) are the softmax's two collectives over the
    ranks (dist's, or identities in one process); stage(name) -> context manager names each
    block of the work (the module's stage hook: the step watchdog, the benchmark's timer).
    """

    def __init__(self, bank, optimizer, *, allreduce_max, allreduce_sum, stage=no_stage):
        self.bank, self.optimizer = bank, optimizer
        self.allreduce_max, self.allreduce_sum, self.stage = allreduce_max, allreduce_sum, stage
        self.pending = None

    def forward_backward(self, embeddings, sample, total_rows, margin):
        raise NotImplementedError

    def update(self, num_update):
        raise NotImplementedError

    def discard(self):
        self.pending = None


BLOCK_ROWS = 512         # rows per update block: the fastest size measured (docs/benchmarks-history.md)


def omp_threads():
    """OMP_NUM_THREADS as a positive int, or None when it is unset or not one."""
    configured = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(configured) if configured.isdigit() and int(configured) >= 1 else None


def default_threads(local_workers):
    """Threads for one rank's bank update: OMP_NUM_THREADS when set, else the cores shared
    by the ranks of this machine."""
    return omp_threads() or cores_per_worker(local_workers)


def numpy_blas():
    """A threadpoolctl controller of NumPy's own BLAS only: limiting every BLAS would also
    set MXNet's OpenMP thread count (its OpenBLAS is the OpenMP build)."""
    controller = ThreadpoolController()
    paths = [lib.filepath for lib in controller.lib_controllers
             if lib.user_api == "blas" and "numpy" in lib.filepath]
    return controller.select(filepath=paths)


class Workspace:
    """Reused float32 buffers by name, grown to the largest size asked for. Buffers of a
    step are views of their first elements, so every buffer is contiguous."""

    def __init__(self):
        self.flat = {}

    def get(self, name, shape):
        size = int(np.prod(shape))
        if name not in self.flat or self.flat[name].size < size:
            self.flat[name] = np.empty(size, dtype=np.float32)
        return self.flat[name][:size].reshape(shape)


class HostHead(Head):
    """The Head of one rank whose MemoryBank is a CPU bank of any storage (row_storage: its rows
    are read into float32 and written back as stored, rounding stochastically); `threads` share
    the update."""

    def __init__(self, bank, optimizer, *, allreduce_max, allreduce_sum, stage=no_stage, threads=1):
        if not (isinstance(threads, int) and threads >= 1):
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        if bank.ctx.device_type != "cpu":
            raise ValueError(f"HostHead needs a bank in host memory, got one on {bank.ctx}")
        super().__init__(bank, optimizer, allreduce_max=allreduce_max, allreduce_sum=allreduce_sum, stage=stage)
        self.rows = bank.host_rows()
        self.workspace = Workspace()
        self.threads, self.pool = threads, None
        self.numpy_blas = numpy_blas() if threads > 1 else None

    @staticmethod
    def workspace_bytes(num_sampled, global_batch, embedding_size, threads, rows_are_bank):
        """The float32 sampled rows (none when `rows_are_bank`: every row of a one-block float32
        shard, read in place), cosine and gradient (B x K), B x D terms, and each thread's update
        buffers."""
        k, b, d = num_sampled, global_batch, embedding_size
        return 4 * ((0 if rows_are_bank else k * d) + 2 * b * k + 3 * b * d + 3 * threads * BLOCK_ROWS * d)

    def forward_backward(self, embeddings, sample, total_rows, margin):
        stage, index, target = self.stage, sample.index, sample.targets
        x = embeddings.asnumpy()
        for blocks in self.bank.row_arrays().values():
            for block in blocks:
                block.wait_to_read()         # MXNet writes to the bank (a load) must have landed
        self._check_index(index)
        # sorted and distinct, every row of a shard readable in place: the bank itself, in order
        whole_shard = self.rows.whole() if len(index) == self.bank.num_local else None
        with stage("gather_rows"):   # 4. the sampled rows (momentum rows are read in `update`)
            rows = whole_shard[0] if whole_shard else self.rows.take_weights(
                index, self.workspace.get("rows", (len(index), x.shape[1])))
        with stage("logits"):        # 5. cosine = x_hat . w_hat^T, scaled by 1/|w| on B x K
            x_norms = np.sqrt(np.einsum("ij,ij->i", x, x)) + NORM_EPS
            x_hat = x / x_norms[:, None]
            inv_w = 1.0 / (np.sqrt(np.einsum("ij,ij->i", rows, rows)) + NORM_EPS)
            cosine = np.dot(x_hat, rows.T, out=self.workspace.get("cosine", (len(x), len(index))))
            cosine *= inv_w
        with stage("softmax"):       # 6-8. margin on the targets, exact softmax, d loss / d cosine
            loss, grad = self._margin_softmax(cosine, target, total_rows, margin, sample.logit_offsets)
        with stage("gradients"):     # through both normalisations; the rows' part waits for `update`
            grad *= inv_w                                        # now d loss / d (x_hat . w^T)
            grad_x_hat = np.dot(grad, rows)
            radial = np.einsum("ij,ij->i", grad_x_hat, x_hat)
            grad_x = (grad_x_hat - x_hat * radial[:, None]) / x_norms[:, None]
            row_radial = np.einsum("bk,bk->k", grad, cosine) * inv_w   # <d w_hat, w_hat> / |w|^2
        self.pending = (index, whole_shard, rows, grad, x_hat, row_radial, self.optimizer.decay(sample.decay_scales))
        return mx.nd.array([loss], ctx=embeddings.context), mx.nd.array(grad_x, ctx=embeddings.context)

    def _margin_softmax(self, cosine, target, total_rows, margin, logit_offsets=None):
        """(mean loss, d loss / d cosine) with the exact softmax over all ranks' columns
        (the collectives as in device_head.py), `logit_offsets` (K,) added to the logits; the
        gradient overwrites a reused buffer."""
        scale = margin.s
        rows = np.flatnonzero(target >= 0)
        columns = target[rows]
        psi, slope = margin.target(cosine[rows, columns])
        values, negative_slope = cosine, None
        if margin.touches_negatives:     # every row's target cosine, on every rank
            cos_target = np.zeros(len(cosine), dtype=np.float32)
            cos_target[rows] = cosine[rows, columns]
            cos_target = _to_numpy(self.allreduce_sum(mx.nd.array(cos_target), "softmax.target_cosine"))
            margin.observe(cos_target)
            values, negative_slope = margin.negatives(cosine, cos_target)
        logits = np.multiply(values, scale, out=self.workspace.get("grad", cosine.shape))
        target_logit = np.zeros(len(cosine), dtype=np.float32)
        target_logit[rows] = psi * scale
        logits[rows, columns] = target_logit[rows]
        if logit_offsets is not None:    # 0 on every target column: the target logit stays
            logits += logit_offsets
        row_max = _to_numpy(self.allreduce_max(mx.nd.array(logits.max(axis=1)), "softmax.row_max"))
        logits -= row_max[:, None]
        exp = np.exp(logits, out=logits)
        sums = _to_numpy(self.allreduce_sum(mx.nd.array(np.stack([exp.sum(axis=1), target_logit])),
                                       "softmax.sum_and_target"))
        row_sum, global_target_logit = sums[0], sums[1]
        loss = float(np.sum(row_max + np.log(row_sum) - global_target_logit)) / total_rows
        # d loss / d cosine = s (softmax - onehot) / N, times the margin's slope on the negatives it
        # touches; on a target entry times psi'(c)
        grad = np.multiply(exp, (scale / (row_sum * total_rows))[:, None], out=exp)
        if negative_slope is not None:
            at_target = grad[rows, columns]          # a copy: the target's slope is psi'
            grad *= negative_slope
            grad[rows, columns] = at_target
        grad[rows, columns] = (grad[rows, columns] - scale / total_rows) * slope
        return loss, grad

    def update(self, num_update):
        """10. The optimizer's SGD-momentum on the sampled rows, block by block.

        The rows' gradient is g = G^T x_hat - w r (r = <d w_hat, w_hat> / |w|^2, G the scaled
        d loss / d cosine). The optimizer's scaled step a (g + wd w) is formed as
        G^T (a x_hat) + w a (wd - r), wd per row with the weight-decay correction: one GEMM and
        one pass per block; its `apply` does the rest.
        Blocks hold distinct rows: `threads` threads take every threads-th block, each with
        one BLAS thread (the blocks are memory-bound; measured: docs/benchmarks-history.md).
        """
        index, whole_shard, rows, grad, x_hat, row_radial, decay = self.pending
        opt = self.optimizer
        step_scale, weight_scale = opt.step_scales(num_update)
        x_factor, row_factor = x_hat * step_scale, step_scale * (decay - row_radial)
        keys = self.rows.keys(num_update)           # the rounding noise of rows written back, if any
        block = min(BLOCK_ROWS, len(index))
        starts = range(0, len(index), block)
        threads = min(self.threads, len(starts))

        def update_blocks(thread):
            step_buffer, scaled_buffer, momentum_buffer = (
                self.workspace.get(f"{name}.{thread}", (block, x_hat.shape[1]))
                for name in ("step", "scaled", "momentum"))
            for lo in starts[thread::threads]:
                hi = min(lo + block, len(index))
                weight, n = rows[lo:hi], hi - lo
                step = np.dot(grad[:, lo:hi].T, x_factor, out=step_buffer[:n])
                step += np.multiply(weight, row_factor[lo:hi, None], out=scaled_buffer[:n])
                mom = (whole_shard[1][lo:hi] if whole_shard
                       else self.rows.take_momentum(index[lo:hi], momentum_buffer[:n]))
                opt.apply(weight, mom, step, weight_scale, scratch=scaled_buffer[:n])
                if not whole_shard:
                    self.rows.put_weights(index[lo:hi], weight, keys[0])
                    self.rows.put_momentum(index[lo:hi], mom, keys[1])

        if threads == 1:
            update_blocks(0)
        else:
            with self.numpy_blas.limit(limits=1):
                list(self._pool(threads).map(update_blocks, range(threads)))
        self.pending = None

    def _pool(self, threads):
        if self.pool is None or self.pool._max_workers != threads:
            self.pool = ThreadPoolExecutor(threads, thread_name_prefix="host_head")
        return self.pool

    def _check_index(self, index):
        """np.take(mode='clip') would clamp a bad index silently: check it once here."""
        if len(index) and (index[0] < 0 or index[-1] >= self.bank.num_local
                           or np.any(np.diff(index) <= 0)):
            raise ValueError(f"sampled index must be sorted distinct rows in [0, {self.bank.num_local}), "
                             f"got {len(index)} values from {index[0]} to {index[-1]}")


def _to_numpy(array):
    return array.asnumpy() if isinstance(array, mx.nd.NDArray) else np.asarray(array)
