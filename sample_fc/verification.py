"""Face verification on insightface .bin pair sets: embeddings, 10-fold accuracy, TAR@FAR.

Protocol (as in insightface's verification): embeddings of each image and its horizontal
mirror are summed and L2-normalised; a pair's distance is the squared L2 distance of its
two embeddings (0..4); a pair is accepted as "same" when its distance < threshold.
Accuracy is 10-fold: on each fold the threshold is the one that maximises accuracy on the
other 9 folds, and accuracy is measured on the held-out fold. The thresholds tried are those
the observed training distances make distinct (see best_threshold), not a fixed grid: a
grid misses every useful threshold when the distances crowd into a range narrower than its
step (near-collapsed embeddings), while TAR@FAR, read off the observed scores, does not.
"""
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from . import fused_ops
from .errors import UsageError

FOLDS = 10          # the k of k-fold accuracy
MIN_PAIRS = FOLDS   # the fewest pairs a set can be scored on (one per fold); make_bin writes no fewer


@dataclass
class VerificationResult:
    accuracy: float        # mean 10-fold accuracy
    accuracy_std: float
    tar_at_far: float      # true accept rate at FAR <= far (threshold from all pairs)
    far: float
    embedding_norm: float  # mean norm of the un-normalised (flip-summed) embeddings

    def line(self, name):
        return (f"{name}: accuracy {self.accuracy:.4f} +- {self.accuracy_std:.4f}, "
                f"TAR@FAR={self.far:g} {self.tar_at_far:.4f}, embedding norm {self.embedding_norm:.2f}")


def l2_normalize(embeddings):
    """Rows scaled to unit L2 norm (zero rows stay zero)."""
    return embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)


def pair_distances(embeddings):
    """Squared L2 distances of pairs (2i, 2i+1) of L2-normalised embeddings."""
    normalized = l2_normalize(embeddings)
    return np.sum((normalized[0::2] - normalized[1::2]) ** 2, axis=1)


def best_threshold(distances, issame):
    """(threshold, accuracy) of the threshold that maximises the accuracy of
    `distances < threshold` against issame.

    Candidates: one below the smallest distance (accept none), the midpoints between
    consecutive distinct sorted distances, one above the largest (accept all); each gives a
    different split, and together they give every split a threshold can make. Ties go to the
    smallest candidate. O(n log n): one sort, then the correct counts of all candidates at
    once from cumulative counts of genuine pairs.
    """
    distances = np.asarray(distances, dtype=np.float64)   # float32 midpoints are exact in float64
    if len(distances) == 0:
        raise ValueError("best_threshold needs at least one pair")
    order = np.argsort(distances, kind="stable")
    ordered, same = distances[order], np.asarray(issame, dtype=bool)[order]
    # accepting the k smallest distances (k = 0..n) is right on the genuine pairs among
    # them and on the impostors among the others
    accepted = np.arange(len(ordered) + 1)
    genuine_accepted = np.concatenate([[0], np.cumsum(same)])
    impostors_rejected = (len(ordered) - genuine_accepted[-1]) - (accepted - genuine_accepted)
    correct = genuine_accepted + impostors_rejected
    # a threshold can only split where the distance changes: k = 0, k = n, or d[k-1] < d[k]
    splits = np.concatenate([[True], ordered[:-1] < ordered[1:], [True]])
    lower, upper = ordered[:-1][splits[1:-1]], ordered[1:][splits[1:-1]]
    middle = (lower + upper) / 2
    middle = np.where(middle > lower, middle, upper)      # adjacent floats: any t in (a, b] splits
    thresholds = np.concatenate([[ordered[0] - 1.0], middle, [ordered[-1] + 1.0]])
    correct = correct[splits]
    best = int(np.argmax(correct))                        # the first, i.e. smallest, of the best
    return float(thresholds[best]), float(correct[best] / len(ordered))


def check_pair_set(issame, name):
    """UsageError naming `name` unless the pair set can be scored: at least MIN_PAIRS pairs, and
    both genuine and impostor pairs (TAR@FAR needs both)."""
    issame = np.asarray(issame, dtype=bool)
    if len(issame) < MIN_PAIRS:
        raise UsageError(f"{name}: {len(issame)} pairs; verification needs at least {MIN_PAIRS} "
                         f"({FOLDS}-fold accuracy scores each fold on its own pairs)")
    if issame.all() or not issame.any():
        raise UsageError(f"{name}: all {len(issame)} pairs are {'same' if issame.all() else 'different'}-identity "
                         f"pairs; verification needs both kinds (1 and 0)")


def kfold_accuracy(distances, issame, folds=FOLDS):
    """(mean, std) of k-fold accuracy; folds are contiguous blocks of pairs, unshuffled; each
    fold is scored at the best_threshold of the other folds."""
    distances, issame = np.asarray(distances, dtype=np.float64), np.asarray(issame, dtype=bool)
    if len(distances) != len(issame) or len(issame) < folds:
        raise ValueError(f"need as many distances as issame flags and >= {folds} pairs, "
                         f"got {len(distances)} and {len(issame)}")
    fold_of = np.arange(len(issame)) * folds // len(issame)
    scores = []
    for fold in range(folds):
        train, test = fold_of != fold, fold_of == fold
        threshold, _ = best_threshold(distances[train], issame[train])
        scores.append(np.mean((distances[test] < threshold) == issame[test]))
    return float(np.mean(scores)), float(np.std(scores))


def tar_at_far(distances, issame, far=1e-3):
    """True accept rate at the largest threshold whose false accept rate is <= far."""
    distances, issame = np.asarray(distances, dtype=np.float64), np.asarray(issame, dtype=bool)
    genuine, impostor = np.sort(distances[issame]), np.sort(distances[~issame])
    if len(genuine) == 0 or len(impostor) == 0:
        raise ValueError("TAR@FAR needs both genuine and impostor pairs")
    allowed = int(np.floor(far * len(impostor)))          # impostors we may accept
    threshold = impostor[allowed] if allowed < len(impostor) else np.inf
    return float(np.mean(genuine < threshold))


def to_nchw(images_uint8):
    """(N, H, W, 3) uint8 RGB -> (N, 3, H, W) float32 pixels 0..255, as training feeds them
    (the backbone symbol normalises)."""
    return images_uint8.transpose(0, 3, 1, 2).astype(np.float32)


class Embedder:
    """Embeds batches of images with a backbone symbol + params on one context; with flip
    (the default) each embedding is that of the image plus that of its mirror. `symbol` may
    also be a graph that runs itself, forward(pixels) -> (N, D) (onnx_model.OnnxGraph: an ONNX
    model on onnxruntime, no params, on the CPU)."""

    def __init__(self, symbol, arg_params, aux_params, ctx, image_size, batch_size=64, flip=True, progress=None):
        self.batch_size, self.ctx, self.flip = batch_size, ctx, flip
        self.progress = progress      # progress(n), when set, is told after each n images embedded
        if not isinstance(symbol, mx.sym.Symbol):
            self.forward = symbol.forward
            return
        data_shape = (batch_size, 3, image_size, image_size)
        if ctx.device_type == "cpu":
            symbol = fused_ops.fuse(symbol, data_shape)      # the same outputs, faster
        self.module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=ctx)
        self.module.bind(data_shapes=[("data", data_shape)],
                         for_training=False)
        self.module.set_params(arg_params, aux_params, allow_missing=False)

    def forward(self, batch):
        """(batch_size, D) outputs of one padded batch of pixels."""
        self.module.forward(mx.io.DataBatch([mx.nd.array(batch, ctx=self.ctx)]), is_train=False)
        return self.module.get_outputs()[0].asnumpy()

    def __call__(self, images):
        """Embeddings (N, D) of images (N, 3, H, W), pixels 0..255, flip-summed if self.flip; or of
        uint8 images (N, H, W, 3) as a .bin holds them, made float32 one batch at a time (a pair set
        never whole in float32: LFW at 112 px would be 1.8 GB)."""
        outputs = []
        as_stored = images.dtype == np.uint8 and images.ndim == 4 and images.shape[-1] == 3
        for start in range(0, len(images), self.batch_size):
            chunk = images[start:start + self.batch_size]
            chunk = to_nchw(chunk) if as_stored else chunk
            padded = np.zeros((self.batch_size,) + chunk.shape[1:], dtype=np.float32)
            padded[:len(chunk)] = chunk
            total = 0
            for view in (padded, padded[:, :, :, ::-1]) if self.flip else (padded,):
                total = total + self.forward(view)
            outputs.append(total[:len(chunk)])
            if self.progress:
                self.progress(len(chunk))
        return np.concatenate(outputs)


def evaluate(embed, images_uint8, issame, far=1e-3, pairs_per_chunk=256):
    """VerificationResult of `embed` (images (n, 3, H, W) float32 -> embeddings) on a pair set,
    embedded `pairs_per_chunk` pairs at a time: no copy of the whole set in float32, nor all its
    embeddings at once (the raw-pixel baseline's are 3 H W wide)."""
    distances, norms = [], []
    for start in range(0, len(images_uint8), 2 * pairs_per_chunk):
        embeddings = embed(to_nchw(images_uint8[start:start + 2 * pairs_per_chunk]))
        distances.append(pair_distances(embeddings))
        norms.append(np.linalg.norm(embeddings, axis=1))
    return score_distances(np.concatenate(distances), np.concatenate(norms), issame, far)


def score(embeddings, issame, far=1e-3):
    """VerificationResult of the (un-normalised) embeddings of a pair set's images."""
    return score_distances(pair_distances(embeddings), np.linalg.norm(embeddings, axis=1), issame, far)


def score_distances(distances, norms, issame, far=1e-3):
    """VerificationResult of a pair set's pair distances and its embeddings' norms."""
    accuracy, std = kfold_accuracy(distances, issame)
    return VerificationResult(accuracy, std, tar_at_far(distances, issame, far), far, float(np.mean(norms)))


def raw_pixel_embed(images):
    """The baseline 'embedding': centred flattened pixels, flip-summed like the model's."""
    centred = images - 127.5
    return (centred + centred[:, :, :, ::-1]).reshape(len(images), -1)
