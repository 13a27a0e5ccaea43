"""Independent NumPy (float64) references for the tests: margin, softmax loss, head, SGD.

Written from the formulas in DESIGN.md, not from the library code.
"""
import numpy as np


def psi(c, m1, m2, m3):
    """cos(m1*theta + m2) - m3, continued as c - cos(theta*) - 1 - m3 past theta* = (pi-m2)/m1."""
    c = np.asarray(c, dtype=np.float64)
    theta = np.arccos(np.clip(c, -1.0, 1.0))
    angle = m1 * theta + m2
    theta_star = (np.pi - m2) / m1
    tail = c - np.cos(min(theta_star, np.pi)) - 1.0 - m3
    return np.where(angle > np.pi, tail, np.cos(angle) - m3)


def psi_slope(c, m1, m2, m3):
    """d psi / dc of `psi` (analytic)."""
    theta = np.arccos(np.clip(c, -1.0, 1.0))
    angle = m1 * theta + m2
    return np.where(angle > np.pi, 1.0, m1 * np.sin(angle) / np.sin(theta))


def logits_with_margin(cosine, labels, m1, m2, m3, s):
    logits = s * np.asarray(cosine, dtype=np.float64).copy()
    rows = np.flatnonzero(labels >= 0)
    logits[rows, labels[rows]] = s * psi(cosine[rows, labels[rows]], m1, m2, m3)
    return logits


def softmax_loss_rows(cosine, labels, m1, m2, m3, s, offsets=None):
    """Per-row loss logsumexp(logits) - target logit (0 where label = -1), and the softmax;
    `offsets` (per column) are added to every row's logits first."""
    logits = logits_with_margin(cosine, labels, m1, m2, m3, s)
    if offsets is not None:
        logits = logits + np.asarray(offsets, dtype=np.float64)[None, :]
    top = logits.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    target = np.where(labels >= 0, logits[np.arange(len(labels)), np.maximum(labels, 0)], 0.0)
    probs = np.exp(logits - lse[:, None])
    return lse - target, probs


def softmax_loss_grad(cosine, labels, m1, m2, m3, s, offsets=None):
    """Mean loss and d mean loss / d cosine."""
    loss_rows, probs = softmax_loss_rows(cosine, labels, m1, m2, m3, s, offsets)
    n = len(labels)
    rows = np.flatnonzero(labels >= 0)
    onehot = np.zeros_like(probs)
    onehot[rows, labels[rows]] = 1.0
    grad = s * (probs - onehot) / n
    grad[rows, labels[rows]] *= psi_slope(cosine[rows, labels[rows]], m1, m2, m3)
    return loss_rows.mean(), grad


def normalize(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def head_loss_grads(embeddings, weights, labels, m1, m2, m3, s, offsets=None):
    """Full-softmax head: mean loss, dL/d embeddings, dL/d weights (labels = weight rows);
    `offsets` per weight row are added to the logits."""
    x_norm = np.linalg.norm(embeddings, axis=1, keepdims=True)
    w_norm = np.linalg.norm(weights, axis=1, keepdims=True)
    x_hat, w_hat = embeddings / x_norm, weights / w_norm
    loss, grad_cos = softmax_loss_grad(x_hat @ w_hat.T, labels, m1, m2, m3, s, offsets)
    gx, gw = grad_cos @ w_hat, grad_cos.T @ x_hat
    grad_x = (gx - x_hat * (gx * x_hat).sum(1, keepdims=True)) / x_norm
    grad_w = (gw - w_hat * (gw * w_hat).sum(1, keepdims=True)) / w_norm
    return loss, grad_x, grad_w


def sgd_momentum(weight, grad, mom, lr, momentum, wd):
    """MXNet sgd_mom_update: mom = momentum*mom - lr*(grad + wd*w); w += mom."""
    mom = momentum * mom - lr * (grad + wd * weight)
    return weight + mom, mom


def sgd_momentum_pytorch(weight, grad, mom, lr, momentum, wd):
    """torch.optim.SGD's form, with mom = -buf: buf = momentum*buf + grad + wd*w;
    w -= lr*buf. Returns (weight, -buf)."""
    buf = momentum * -mom + grad + wd * weight
    return weight - lr * buf, -buf


def partial_fc_run(data, labels, backbone_weight, centers, sampled, lr_of_step, margins,
                   momentum=0.9, wd=5e-4, grad_norms=None, offsets=None, decay_scales=None):
    """Reference training of a linear backbone (embeddings = flat(data) W^T + b) + centers.

    sampled[t]: sorted global class ids scored at step t (all classes at ratio 1.0); only
    those bank rows are updated; offsets[t] (if given): the logit offset of each of them;
    decay_scales[t] (if given): the factor of each one's weight decay. The bias has no weight
    decay (MXNet's wd_mult default).
    Returns (losses, backbone weight, bias, bank weight, bank momentum); appends each step's
    global L2 norm of the backbone gradients (weight and bias) to the list `grad_norms` if given.
    """
    weight, bias = backbone_weight.astype(np.float64), np.zeros(backbone_weight.shape[0])
    weight_mom, bias_mom = np.zeros_like(weight), np.zeros_like(bias)
    bank_w, bank_m = centers.astype(np.float64).copy(), np.zeros(centers.shape)
    losses = []
    for step in range(len(data)):
        flat = data[step].reshape(len(data[step]), -1)
        columns = np.asarray(sampled[step], dtype=np.int64)
        positions = np.searchsorted(columns, labels[step])
        assert np.array_equal(columns[positions], labels[step]), "a positive was not sampled"
        loss, grad_x, grad_w = head_loss_grads(flat @ weight.T + bias, bank_w[columns], positions, *margins,
                                               offsets=None if offsets is None else offsets[step])
        lr = lr_of_step(step + 1)
        bank_wd = wd if decay_scales is None else wd * np.asarray(decay_scales[step])[:, None]
        bank_w[columns], bank_m[columns] = sgd_momentum(bank_w[columns], grad_w, bank_m[columns],
                                                        lr, momentum, bank_wd)
        grad_weight, grad_bias = grad_x.T @ flat, grad_x.sum(0)
        if grad_norms is not None:
            grad_norms.append(np.sqrt(np.sum(grad_weight ** 2) + np.sum(grad_bias ** 2)))
        weight, weight_mom = sgd_momentum(weight, grad_weight, weight_mom, lr, momentum, wd)
        bias, bias_mom = sgd_momentum(bias, grad_bias, bias_mom, lr, momentum, 0.0)
        losses.append(loss)
    return np.array(losses), weight, bias, bank_w, bank_m


def assert_close(actual, expected, rtol=1e-5, err_msg=""):
    """Elementwise relative tolerance, with an absolute floor of rtol * max|expected|: float32
    sums of terms of the array's scale cannot resolve entries much smaller than that."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max(),
                               err_msg=err_msg)
