"""The device kernel of the head: the Head contract of head.py (DeviceHead) with MXNet operators on the
bank's own context, any device and dtype, in two pure functions with hand-written backwards.

The margin softmax cross-entropy, exact across ranks (also the single-process loss,
`margin_cross_entropy`): each rank holds some columns (class centers) of every row; `target`
gives the row's target column here, or -1 when the target lives on another rank. Two small
collectives make the softmax exact over all ranks' columns: the row max (op Max), then, in one
call, the row sum of exp(logit - max) together with the target logit (op Sum). The loss is the
log-sum-exp form max + log(sum) - target, which never saturates. With identity "collectives"
the same code is the single-process loss.

The head around it (head_forward_backward):

    x_hat = X / |X|, w_hat = W / |W|, cosine = x_hat . w_hat^T            (B x K)
    loss  = mean over B of the exact margin softmax cross-entropy
    dX, dW by the chain rule through the softmax, the margin and both normalisations.

Three GEMMs (cosine, d x_hat, d w_hat) dominate; they run as FullyConnected/dot on the
arrays' own context, so the same code serves CPU and GPU. A bank in host memory runs head.py's
HostHead instead (partial_fc.make_head chooses).
"""
import mxnet as mx
import numpy as np

from .head import NORM_EPS, Head, no_stage
from .margin import CombinedMargin


def _identity(array, name):
    return array


def margin_softmax_forward(cosine, target, margin, allreduce_max=_identity, allreduce_sum=_identity,
                           logit_offsets=None):
    """Forward pass. cosine: (N, K) NDArray; target: (N,) int NDArray, -1 = not here;
    margin: pfc/margin.py's interface; logit_offsets: None or a (K,) NDArray added to every row's
    logits (sampled-softmax correction, sampler.sampled_logit_offsets; 0 on target columns).

    Returns (loss_rows (N,), cache) where cache feeds `margin_softmax_backward`.
    allreduce_max / allreduce_sum(array, name): collectives over the ranks that share rows.
    """
    num_rows, num_cols = cosine.shape
    has_target = (target >= 0).astype(cosine.dtype)
    column = mx.nd.maximum(target, 0)
    onehot = mx.nd.one_hot(target, num_cols, dtype=cosine.dtype)   # zero row where target = -1
    cos_target = mx.nd.pick(cosine, column, axis=1) * has_target
    psi, psi_slope = margin.target(cos_target)
    target_logit = psi * (margin.s * has_target)
    values, negative_slope, values_at_target = cosine, None, cos_target
    if margin.touches_negatives:     # every row's target cosine, on every rank
        all_targets = allreduce_sum(cos_target, "softmax.target_cosine")
        margin.observe(all_targets)
        values, negative_slope = margin.negatives(cosine, all_targets)
        values_at_target = mx.nd.pick(values, column, axis=1) * has_target
    # logits = s * values, with the target entries replaced by s * psi(cos_target)
    logits = mx.nd.broadcast_add(values * margin.s,
                                 onehot * (target_logit - values_at_target * margin.s).reshape((-1, 1)))
    if logit_offsets is not None:
        logits = mx.nd.broadcast_add(logits, logit_offsets.reshape((1, -1)))

    row_max = allreduce_max(mx.nd.max(logits, axis=1), "softmax.row_max")
    exp = mx.nd.exp(mx.nd.broadcast_sub(logits, row_max.reshape((-1, 1))))
    sums = allreduce_sum(mx.nd.stack(mx.nd.sum(exp, axis=1), target_logit), "softmax.sum_and_target")
    row_sum, global_target_logit = sums[0], sums[1]
    loss_rows = row_max + mx.nd.log(row_sum) - global_target_logit
    probs = mx.nd.broadcast_div(exp, row_sum.reshape((-1, 1)))
    cache = (probs, onehot, column, has_target, psi_slope, negative_slope, margin.s)
    return loss_rows, cache


def margin_softmax_backward(cache, grad_rows):
    """d loss / d cosine (N, K), given grad_rows = d objective / d loss_rows (N,)."""
    probs, onehot, column, has_target, psi_slope, negative_slope, scale = cache
    grad_rows = grad_rows.reshape((-1, 1))
    grad_logits = mx.nd.broadcast_mul(probs - onehot, grad_rows)
    # d logit / d cosine is s (times the margin's slope on the negatives it touches), and on the
    # target entry s * psi'(cos_target)
    target_grad_logit = (mx.nd.pick(probs, column, axis=1) - 1.0) * has_target * grad_rows.reshape(-1)
    if negative_slope is None:
        correction = target_grad_logit * (psi_slope - 1.0) * scale
        return mx.nd.broadcast_add(grad_logits * scale, onehot * correction.reshape((-1, 1)))
    correction = target_grad_logit * (psi_slope - mx.nd.pick(negative_slope, column, axis=1)) * scale
    return mx.nd.broadcast_add(grad_logits * negative_slope * scale, onehot * correction.reshape((-1, 1)))


class _MarginCrossEntropy(mx.autograd.Function):
    """Autograd wrapper: loss rows from (cosine, target) with the hand-written backward."""

    def __init__(self, margin):
        super().__init__()
        self.margin = margin
        self.cache = None

    def forward(self, cosine, target):
        loss_rows, self.cache = margin_softmax_forward(cosine, target, self.margin)
        return loss_rows, self.cache[0]

    def backward(self, grad_loss_rows, grad_probs):
        grad_cosine = margin_softmax_backward(self.cache, grad_loss_rows)
        return grad_cosine, mx.nd.zeros(grad_cosine.shape[:1], ctx=grad_cosine.context)


REDUCTIONS = ("mean", "sum", "none")


def margin_cross_entropy(cosine, labels, margin1=1.0, margin2=0.5, margin3=0.0, scale=64.0,
                         return_softmax=False, reduction="mean"):
    """Margin softmax cross-entropy on cosine logits, single process, with autograd.

    cosine: (N, K) NDArray of cosines; labels: (N,) integer NDArray of target columns,
    -1 meaning the row has no target column here (its target logit counts as 0).
    Mirrors PaddlePaddle's `margin_cross_entropy` API. Returns the loss (reduced as asked)
    and, if return_softmax, the softmax probabilities (N, K).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    _check_int_labels(labels, cosine)
    margin = CombinedMargin(margin1, margin2, margin3, scale)
    loss_rows, probs = _MarginCrossEntropy(margin)(cosine, labels)
    loss = {"mean": mx.nd.mean, "sum": mx.nd.sum, "none": lambda rows: rows}[reduction](loss_rows)
    return (loss, probs) if return_softmax else loss


def _check_int_labels(labels, cosine):
    if np.dtype(labels.dtype).kind not in "iu":
        raise TypeError(f"labels must be an integer NDArray, got dtype {np.dtype(labels.dtype).name}")
    if labels.shape != cosine.shape[:1]:
        raise ValueError(f"labels shape {labels.shape} does not match cosine rows {cosine.shape[:1]}")


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
