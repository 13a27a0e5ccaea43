"""How far is the sampled softmax from the full one, at a trained checkpoint?

    .venv/bin/python -m bench.sampling_fidelity --model MODELS_ROOT --rec train.rec
        [--ratio 0.1] [--images 1024] [--draws 20]

Embeds --images training images (eval mode, no mirror) with the checkpoint's backbone,
scores them against every class center of its bank with the run's margin and scale, and
prints, for global batches of the run's size:
- the full softmax: loss, and how spread each row's negatives are (their effective count
  1 / sum(p^2) over the negatives' normalised probabilities, and the hardest one's share):
  what choosing negatives by hardness could win;
- the sampled softmax at --ratio, drawn as training draws it (each rank's shard: the batch's
  positives plus uniform negatives, the log(F/n) correction): the relative squared error and
  the cosine of the loss's gradient w.r.t. each (normalised) embedding against the full
  softmax's, and the bias left in the mean of --draws draws; and the same error of the batch's
  summed gradient (sum over the batch's rows), which is larger where the rows' errors share a
  direction (a step's sample is shared by every row of the batch);
- the centers' side: the share of the push on the centers that is common to all of them
  (|mean_j P_j|^2 / mean_j |P_j|^2): the most a control variate shared by every center removes;
  and the variance of the sampled pushes if each rank drew its negatives with probability in
  proportion to |P_j| (an oracle: the push known before the draw) as a share of the uniform
  draw's: the most any choice of which centers to draw removes; the share of the pushes' energy
  (sum of |P_j|^2) that each center's own push in the other batches does not predict (the
  most a control variate kept per center, at this fixed checkpoint, removes), and the share
  carried by the top 1% of centers;
- with --classes N (default 200; 0: skip), every training image of N classes: how well the
  centers follow their classes (the cosine of each center with its class's mean embedding),
  how well the backbone alone separates them (each image's nearest class mean among the N),
  and the centers' mean norm. Across seeds of one setting these move by ~0.01, so they can
  rank changes to the centers' training with one seed.
"""
import json
import os

import numpy as np

from sample_fc.checkpoint.layout import bank_shard_files, find_checkpoint, models_root_of, read_state
from sample_fc.checkpoint.bank_shard import read_shard
from sample_fc.errors import MissingFileError, UsageError
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.sampler import class_center_sample, num_sample_for, sampled_logit_offsets
from sample_fc.tools.cli import make_parser, run_or_exit
from sample_fc.verification import Embedder, l2_normalize, to_nchw


def softmax_rows(logits):
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return p / p.sum(axis=1, keepdims=True)


def embedding_gradient(probabilities, centers_hat, target_columns, target_slope, scale):
    """d loss / d e of each row, e its normalised embedding, over the scored columns:
    s * (sum_{j != y} p_j w_j + (p_y - 1) psi'(c_y) w_y), w the normalised centers."""
    p_target = probabilities[np.arange(len(probabilities)), target_columns]
    grad = probabilities @ centers_hat
    grad += ((p_target - 1.0) * target_slope - p_target)[:, None] * centers_hat[target_columns]
    return scale * grad


def full_logits(embeddings_hat, centers_hat, labels, margin):
    """(logits (N, C) with the margin on each row's target, psi'(c_y) (N,))."""
    cosine = embeddings_hat @ centers_hat.T
    rows = np.arange(len(labels))
    psi, slope = margin.psi_and_derivative(cosine[rows, labels])
    logits = margin.s * cosine
    logits[rows, labels] = margin.s * psi
    return logits, slope


def summed_relative_error(gradient, reference):
    """|sum_i (g_i - r_i)|^2 / |sum_i r_i|^2 over the rows of (B, D) gradients."""
    return float(np.sum((gradient - reference).sum(axis=0) ** 2) / np.sum(reference.sum(axis=0) ** 2))


def negatives_spread(probabilities, labels):
    """(effective count, hardest share) of each row's negatives' normalised probabilities."""
    negative = probabilities.copy()
    negative[np.arange(len(labels)), labels] = 0.0
    negative /= negative.sum(axis=1, keepdims=True)
    return 1.0 / np.sum(negative ** 2, axis=1), negative.max(axis=1)


def inclusion_variances(magnitudes, drawn):
    """(variance of the best draw, variance of the uniform draw) of the sampled estimate of the
    pushes on a pool of centers, `drawn` of them drawn: sum_j |P_j|^2 (1/q_j - 1), |P_j| =
    `magnitudes`. Uniform: q_j = drawn / pool; best: q_j proportional to |P_j|, capped at 1
    (the capped ones in with certainty, the rest shared out again)."""
    magnitudes = np.asarray(magnitudes, dtype=np.float64)
    squares = magnitudes ** 2
    if drawn >= len(magnitudes):
        return 0.0, 0.0
    uniform = float(np.sum(squares) * (len(magnitudes) / drawn - 1.0))
    descending = np.sort(magnitudes)[::-1]
    rest = np.cumsum(descending[::-1])[::-1]          # rest[k] = sum of descending[k:]
    certain = 0
    while descending[certain] * (drawn - certain) > rest[certain]:
        certain += 1                                   # its q would exceed 1: in with certainty
    left = descending[certain:][descending[certain:] > 0]      # a zero push costs no variance
    best = float(np.sum(left * rest[certain] / (drawn - certain) - left ** 2)) if len(left) else 0.0
    return best, uniform


def history_residual_share(push_sum, push_squares, batches):
    """Share of the pushes' energy sum_t sum_j |P_tj|^2 left when each P_tj is predicted by the
    mean of P_sj over the other `batches` - 1 batches, from push_sum = sum_t P_t (C, D) and
    push_squares = sum_t sum_j |P_tj|^2: sum_t |n P_t - S|^2 = n^2 Q - n |S|^2, over (n - 1)^2."""
    if batches < 2 or push_squares == 0:
        return float("nan")
    residual = batches ** 2 * push_squares - batches * float(np.sum(push_sum ** 2))
    return max(0.0, residual) / (batches - 1) ** 2 / push_squares      # >= 0 but for rounding


def top_energy_share(magnitudes, fraction=0.01):
    """Share of sum |P_j|^2 carried by the ceil(fraction * n) largest |P_j| (at least one)."""
    squares = np.sort(np.asarray(magnitudes, dtype=np.float64) ** 2)
    total = squares.sum()
    return float(squares[-max(1, int(np.ceil(fraction * len(squares)))):].sum() / total) if total else float("nan")


def sampled_columns(batch_labels, shards, ratio, rng):
    """The columns one global batch scores and their logit offsets, each rank's shard sampled
    as training samples it: [(class_start, num_local)] -> (global columns, offsets)."""
    columns, offsets = [], []
    for class_start, num_local in shards:
        target, local = class_center_sample(batch_labels, num_local, num_sample_for(num_local, ratio),
                                            class_start, rng)
        offset = sampled_logit_offsets(target, len(local), num_local)
        columns.append(class_start + local)
        offsets.append(np.zeros(len(local)) if offset is None else offset.astype(np.float64))
    return np.concatenate(columns), np.concatenate(offsets)


def fidelity(embeddings, labels, centers, shards, margin, ratio, batch_size, draws, rng):
    """The statistics printed (see the module's doc) as a dict; embeddings (N, D), labels (N,)
    global class ids, centers (C, D), shards [(class_start, num_local)] covering [0, C)."""
    e, w = l2_normalize(embeddings), l2_normalize(centers)
    logits, slope = full_logits(e, w, labels, margin)
    p_full = softmax_rows(logits)
    g_full = embedding_gradient(p_full, w, labels, slope, margin.s)
    norm_full = np.sum(g_full ** 2, axis=1)
    rows = np.arange(len(labels))
    effective, hardest = negatives_spread(p_full, labels)
    common, best_variance, uniform_variance, top_share = [], 0.0, 0.0, []
    push_sum, push_squares = np.zeros_like(w), 0.0
    batches = [np.arange(b, min(b + batch_size, len(labels))) for b in range(0, len(labels), batch_size)]
    for batch in batches:
        push = p_full[batch].copy()
        push[np.arange(len(batch)), labels[batch]] = 0.0
        push = push.T @ e[batch]                         # (C, D): each center's push
        squares = np.einsum("cd,cd->c", push, push)      # |P_j|^2, once for the three measures
        common.append(np.sum(push.mean(axis=0) ** 2) / np.mean(squares))
        magnitude = np.sqrt(squares)
        push_sum += push
        push_squares += float(np.sum(squares))
        top_share.append(top_energy_share(magnitude))
        positives = np.unique(labels[batch])
        for class_start, num_local in shards:            # each rank draws its negatives from its shard
            local = positives - class_start
            local = local[(local >= 0) & (local < num_local)]
            negative = np.ones(num_local, dtype=bool)
            negative[local] = False
            drawn = max(0, num_sample_for(num_local, ratio) - len(local))
            best, uniform = inclusion_variances(magnitude[class_start:class_start + num_local][negative], drawn)
            best_variance, uniform_variance = best_variance + best, uniform_variance + uniform
    error, cosine, summed_error, mean_grad = [], [], [], np.zeros_like(g_full)
    for _ in range(draws):
        g = np.empty_like(g_full)
        for batch in batches:
            columns, offsets = sampled_columns(labels[batch], shards, ratio, rng)
            target = np.searchsorted(columns, labels[batch])     # columns ascend: ranks in order
            p = softmax_rows(logits[np.ix_(batch, columns)] + offsets)
            g[batch] = embedding_gradient(p, w[columns], target, slope[batch], margin.s)
            summed_error.append(summed_relative_error(g[batch], g_full[batch]))
        mean_grad += g / draws
        error.append(np.sum((g - g_full) ** 2, axis=1) / norm_full)
        cosine.append(np.sum(g * g_full, axis=1) / np.sqrt(np.sum(g ** 2, axis=1) * norm_full))
    bias = np.sum((mean_grad - g_full) ** 2, axis=1) / norm_full
    return {"loss": float(-np.mean(np.log(p_full[rows, labels]))),
            "effective_negatives": effective, "hardest_share": hardest,
            "relative_error": np.concatenate(error), "cosine": np.concatenate(cosine),
            "summed_relative_error": float(np.mean(summed_error)),
            "bias": bias, "common_push_share": float(np.mean(common)),
            "best_draw_variance_share": best_variance / uniform_variance if uniform_variance else 1.0,
            "history_residual_share": history_residual_share(push_sum, push_squares, len(batches)),
            "top_push_energy_share": float(np.mean(top_share))}


def center_alignment(embeddings, labels, centers, classes):
    """(mean cosine of each class's center with its mean normalised embedding, accuracy of the
    nearest class mean over `classes`, mean center norm); every label must be in `classes`."""
    e = l2_normalize(embeddings)
    classes = np.asarray(classes)
    means = l2_normalize(np.stack([e[labels == c].mean(axis=0) for c in classes]))
    w = l2_normalize(centers[classes])
    nearest = classes[np.argmax(e @ means.T, axis=1)]
    return (float(np.mean(np.sum(means * w, axis=1))), float(np.mean(nearest == labels)),
            float(np.mean(np.linalg.norm(centers, axis=1))))


def load_centers(checkpoint):
    """(centers (C, D) float64, [(class_start, num_local)] of the ranks that saved them)."""
    world_size = read_state(checkpoint)["world_size"]
    parts, shards = [], []
    for rank in range(world_size):
        meta, weight, _ = read_shard(bank_shard_files(checkpoint, rank))
        parts.append(np.asarray(weight, dtype=np.float64))
        shards.append((meta["class_start"], meta["num_local"]))
    return np.concatenate(parts), shards


def read_images(rec, image_size, count=None, classes=None, rng=None):
    """(uint8 (N, S, S, 3), labels) of `count` records of `rec` drawn without replacement, or
    of every record whose class is in `classes`."""
    import mxnet as mx
    from sample_fc.data.images import decode_rgb
    from sample_fc.data.recordio import label_to_int, open_record
    reader, keys, _ = open_record(rec)
    if count is not None and count > len(keys):
        raise UsageError(f"--images {count}: {rec} has only {len(keys)} images")
    wanted = set(int(c) for c in classes) if classes is not None else None
    images, labels = [], []
    for key in (rng.choice(keys, count, replace=False) if count is not None else keys):
        header, payload = mx.recordio.unpack(reader.read_idx(int(key)))
        label = label_to_int(header, key)
        if wanted is None or label in wanted:
            labels.append(label)
            try:
                images.append(decode_rgb(payload, image_size))
            except OSError as err:
                raise UsageError(f"{rec}: record {key}: {err}") from None
    return np.stack(images), np.array(labels, dtype=np.int64)


def describe(stats, ratio, draws):
    q = lambda values, p: np.percentile(values, p)    # noqa: E731
    eff, hard = stats["effective_negatives"], stats["hardest_share"]
    err, cos = stats["relative_error"], stats["cosine"]
    history = stats["history_residual_share"]
    return "\n".join([
        f"full softmax: loss {stats['loss']:.2f}; each row's negatives: effective count median "
        f"{q(eff, 50):.1f} (p10 {q(eff, 10):.1f}, p90 {q(eff, 90):.1f}), the hardest one's share "
        f"median {q(hard, 50):.3f} (p90 {q(hard, 90):.3f})",
        f"sampled at ratio {ratio}: the embeddings' gradient has relative squared error mean "
        f"{err.mean():.3f} (median {q(err, 50):.3f}, p90 {q(err, 90):.3f}), cosine to the full "
        f"gradient mean {cos.mean():.3f}; bias of the mean of {draws} draws {stats['bias'].mean():.3f}; "
        f"the batch's summed gradient has relative squared error {stats['summed_relative_error']:.3f} "
        f"(the rows' errors share a direction where this exceeds the rows' own)",
        f"centers: share of the push common to all of them {stats['common_push_share']:.3f}; drawing "
        f"each negative with probability in proportion to its push (known exactly) leaves "
        f"{stats['best_draw_variance_share']:.3f} of the uniform draw's variance of the pushes; "
        + (f"a center's push predicted by its mean over the other batches leaves "
           f"{history:.3f} of their energy" if np.isfinite(history) else
           "(its own history needs two batches or more: --images of at least twice the global batch)")
        + f"; the top 1% of centers carry "
        f"{stats['top_push_energy_share']:.3f} of it"])


def main(argv=None):
    parser = make_parser("bench.sampling_fidelity", __doc__)
    parser.add_argument("--model", required=True, help="models root (its newest checkpoint) or a step-XXXXXXXX/ dir")
    parser.add_argument("--rec", required=True, help="the training .rec the images come from")
    parser.add_argument("--ratio", type=float, help="sample ratio (default: the run's sample_ratio)")
    parser.add_argument("--images", type=int, default=1024, help="training images embedded (default 1024)")
    parser.add_argument("--draws", type=int, default=20, help="samples drawn per batch (default 20)")
    parser.add_argument("--classes", type=int, default=200,
                        help="classes whose every image scores the centers' alignment (default 200; 0: skip)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    def work():
        import mxnet as mx
        from sample_fc.models.saved_model import load_model
        checkpoint = find_checkpoint(args.model, option="--model")
        config_file = os.path.join(models_root_of(checkpoint), "config.json")
        if not os.path.isfile(config_file):
            raise MissingFileError(f"--model {args.model}: {config_file} (the run's config) does not exist")
        with open(config_file) as handle:
            config = json.load(handle)
        ratio = config["sample_ratio"] if args.ratio is None else args.ratio
        centers, shards = load_centers(checkpoint)
        margin = CombinedMargin(config["loss_m1"], config["loss_m2"], config["loss_m3"], config["loss_s"])
        model = load_model(checkpoint)
        rng = np.random.default_rng(args.seed)
        images, labels = read_images(args.rec, model.image_size, count=args.images, rng=rng)
        embed = Embedder(model.symbol, model.arg_params, model.aux_params, mx.cpu(), model.image_size, flip=False)
        embeddings = embed(to_nchw(images)).astype(np.float64)
        batch_size = config["batch_size"] * len(shards)
        print(f"{checkpoint}: {len(centers):,} centers on {len(shards)} ranks, {args.images} images, "
              f"global batch {batch_size}, {margin}")
        stats = fidelity(embeddings, labels, centers, shards, margin, ratio, batch_size, args.draws, rng)
        print(describe(stats, ratio, args.draws))
        if args.classes:
            if args.classes > len(centers):
                raise UsageError(f"--classes {args.classes}: the bank has {len(centers)} classes")
            classes = np.sort(rng.choice(len(centers), args.classes, replace=False))
            images, labels = read_images(args.rec, model.image_size, classes=classes)
            classes = np.unique(labels)
            aligned, accuracy, norm = center_alignment(embed(to_nchw(images)).astype(np.float64), labels,
                                                       centers, classes)
            print(f"centers' alignment over {len(classes)} classes ({len(labels)} images): cosine of a center "
                  f"with its class's mean embedding {aligned:.3f}; nearest class mean accuracy {accuracy:.3f}; "
                  f"mean |w| {norm:.2f}")

    run_or_exit(parser, work)


if __name__ == "__main__":
    main()
