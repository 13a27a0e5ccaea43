"""The Partial FC head of one step, as a pure function with a hand-written backward.

    x_hat = X / |X|, w_hat = W / |W|, cosine = x_hat . w_hat^T            (B x K)
    loss  = mean over B of the exact margin softmax cross-entropy          (softmax.py)
    dX, dW by the chain rule through the softmax, the margin and both normalisations.

Three GEMMs (cosine, d x_hat, d w_hat) dominate; they run as FullyConnected/dot on the
arrays' own context, so the same code serves CPU and GPU.
"""
import contextlib

import mxnet as mx
import numpy as np

from .softmax import margin_softmax_backward, margin_softmax_forward

NORM_EPS = 1e-12


def no_stage(name):
    """The default `stage`: names a block of the step and does nothing (a benchmark passes
    a timer with the same signature to time each block)."""
    return contextlib.nullcontext()


def normalize_rows(matrix):
    """(matrix / row norms, row norms as a column). mx.nd.norm is one fused pass, faster than
    sqrt(sum(square))."""
    norms = mx.nd.norm(matrix, axis=1, keepdims=True) + NORM_EPS
    return mx.nd.broadcast_div(matrix, norms), norms


def row_dots(a, b):
    """<a_i, b_i> for every row, as a column: a batched 1 x D . D x 1 product (faster than
    sum(a * b, axis=1), and no full-size temporary)."""
    rows, width = a.shape
    return mx.nd.batch_dot(a.reshape((rows, 1, width)), b.reshape((rows, width, 1))).reshape((rows, 1))


def normalize_rows_backward(grad_normalized, normalized, norms):
    """Gradient w.r.t. the un-normalised rows: (g - x_hat <g, x_hat>) / |x|."""
    radial = row_dots(grad_normalized, normalized)
    return mx.nd.broadcast_div(grad_normalized - mx.nd.broadcast_mul(normalized, radial), norms)


def head_forward_backward(embeddings, weights, target, margin, total_rows,
                          allreduce_max, allreduce_sum, stage=no_stage, logit_offsets=None):
    """Loss and gradients of the Partial FC head on one rank.

    embeddings: (B, D) the global batch; weights: (K, D) this rank's sampled centers;
    target: (B,) int positions into weights, -1 where the class lives on another rank;
    total_rows: B, the number of rows the loss is averaged over; logit_offsets: None or (K,)
    NDArray added to the logits (0 on target columns).
    Returns (loss (1,) NDArray, grad_embeddings (B, D) partial (this rank's columns only,
    to be summed over ranks), grad_weights (K, D)).
    """
    with stage("logits"):            # cosine GEMM of the normalised rows
        x_hat, x_norms = normalize_rows(embeddings)
        w_hat, w_norms = normalize_rows(weights)
        cosine = mx.nd.FullyConnected(x_hat, w_hat, no_bias=True, num_hidden=weights.shape[0])
    with stage("softmax"):           # margin, exact distributed softmax, d loss / d cosine
        loss_rows, cache = margin_softmax_forward(cosine, target, margin, allreduce_max, allreduce_sum,
                                                  logit_offsets)
        loss = mx.nd.sum(loss_rows) / total_rows
        grad_rows = mx.nd.full(loss_rows.shape, 1.0 / total_rows, ctx=cosine.context, dtype=cosine.dtype)
        grad_cosine = margin_softmax_backward(cache, grad_rows)
    with stage("gradients"):         # two GEMMs and the normalisation backward
        grad_x_hat = mx.nd.dot(grad_cosine, w_hat)
        grad_w_hat = mx.nd.dot(grad_cosine, x_hat, transpose_a=True)
        grad_embeddings = normalize_rows_backward(grad_x_hat, x_hat, x_norms)
        grad_weights = normalize_rows_backward(grad_w_hat, w_hat, w_norms)
    return loss, grad_embeddings, grad_weights


class Head:
    """The head of one rank: steps 4-8 and 10 of a step (docs/DESIGN.md) on its MemoryBank.
    Both kernels implement this contract: DeviceHead (below, MXNet operators on the bank's
    context) and HostHead (host_head.py, NumPy BLAS on a bank in host memory, float32 or float16), pinned to the same
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


class DeviceHead(Head):
    """The head on the bank's own context (any device, any dtype): the sampled rows are copied
    out, `head_forward_backward` runs with MXNet operators, and the update is written back."""

    @staticmethod
    def workspace_bytes(num_sampled, global_batch, embedding_size):
        """Rows, momentum and their gradients (K x D), and the B x K terms of the softmax."""
        return 4 * (6 * num_sampled * embedding_size + 8 * global_batch * num_sampled)

    def forward_backward(self, embeddings, sample, total_rows, margin):
        with self.stage("gather_rows"):    # 4. read the sampled rows of the bank (math in float32)
            weight_rows, momentum_rows = self.bank.device_rows().take(sample.index)
        target = mx.nd.array(sample.targets, ctx=self.bank.ctx, dtype="int64")
        logit_offsets = (None if sample.logit_offsets is None else
                         mx.nd.array(sample.logit_offsets, ctx=self.bank.ctx, dtype="float32"))
        loss, grad_embeddings, grad_weight_rows = head_forward_backward(
            embeddings, weight_rows, target, margin, total_rows, self.allreduce_max, self.allreduce_sum,
            self.stage, logit_offsets)
        self.pending = (sample, weight_rows, momentum_rows, grad_weight_rows)
        return loss, grad_embeddings

    def update(self, num_update):
        sample, weight_rows, momentum_rows, grad_weight_rows = self.pending
        self.optimizer.update(weight_rows, momentum_rows, grad_weight_rows, num_update, sample.decay_scales)
        self.bank.device_rows().put(sample.index, weight_rows, momentum_rows, num_update)
        self.pending = None
