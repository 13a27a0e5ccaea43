"""The one margin softmax cross-entropy, exact across ranks, for the full and sampled paths.

Each rank holds some columns (class centers) of every row; `target` gives the row's target
column here, or -1 when the target lives on another rank. Two small collectives make the
softmax exact over all ranks' columns: the row max (op Max), then, in one call, the row sum
of exp(logit - max) together with the target logit (op Sum). The loss is the log-sum-exp
form max + log(sum) - target, which never saturates. With identity "collectives" the same
code is the single-process loss (`margin_cross_entropy`).
"""
import mxnet as mx
import numpy as np

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
