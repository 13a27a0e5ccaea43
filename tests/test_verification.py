"""Tests for sample_fc.verification: 10-fold accuracy, TAR@FAR, flip-summed embeddings."""
import mxnet as mx
import numpy as np

from sample_fc.verification import Embedder, evaluate, kfold_accuracy, pair_distances, tar_at_far


def _reference_kfold(distances, issame, folds=10):
    """Independent loop version: contiguous folds, best threshold on the other 9."""
    n = len(issame)
    thresholds = [i / 100 for i in range(400)]
    scores = []
    for k in range(folds):
        test = [i for i in range(n) if i * folds // n == k]
        train = [i for i in range(n) if i * folds // n != k]
        best, best_acc = None, -1.0
        for t in thresholds:
            acc = sum((distances[i] < t) == issame[i] for i in train) / len(train)
            if acc > best_acc:
                best, best_acc = t, acc
        scores.append(sum((distances[i] < best) == issame[i] for i in test) / len(test))
    return np.mean(scores), np.std(scores)


def test_identical_pairs_and_orthogonal_impostors_give_accuracy_one():
    """Test that same pairs with identical embeddings and orthogonal impostors score 1.0."""
    rng = np.random.default_rng(0)
    embeddings, issame = [], []
    for i in range(40):
        a = np.eye(8)[i % 8] * rng.uniform(1, 3)
        same = i % 2 == 0
        b = a * 2 if same else np.eye(8)[(i + 1) % 8]
        embeddings += [a, b]
        issame.append(same)
    distances = pair_distances(np.array(embeddings))
    np.testing.assert_allclose(distances[0::2], 0.0, atol=1e-12)
    np.testing.assert_allclose(distances[1::2], 2.0)
    assert kfold_accuracy(distances, np.array(issame)) == (1.0, 0.0)


def test_kfold_matches_an_independent_implementation():
    """Test that the 10-fold accuracy equals a plain-loop reference on overlapping data."""
    rng = np.random.default_rng(1)
    issame = rng.random(200) < 0.5
    distances = np.where(issame, rng.normal(0.9, 0.3, 200), rng.normal(1.5, 0.3, 200)).clip(0, 3.99)
    mean, std = kfold_accuracy(distances, issame)
    want_mean, want_std = _reference_kfold(distances, issame)
    assert abs(mean - want_mean) < 1e-12 and abs(std - want_std) < 1e-12
    assert 0.75 < mean < 0.95


def test_known_best_threshold_case():
    """Test a hand-made case: genuine at 0.5, impostors at 1.5 except one at 0.4 per fold."""
    distances, issame = [], []
    for fold in range(10):
        distances += [0.5] * 5 + [1.5] * 4 + [0.4]
        issame += [True] * 5 + [False] * 5
    mean, _ = kfold_accuracy(np.array(distances), np.array(issame))
    assert abs(mean - 0.9) < 1e-12   # any threshold in (0.5, 1.5] errs on one pair in ten


def test_tar_at_far():
    """Test TAR@FAR: with 1000 impostors and FAR 1e-3, one impostor may pass."""
    impostor = np.linspace(1.0, 2.0, 1000)
    genuine = np.array([0.2, 0.9, 1.0005, 1.5])
    distances = np.concatenate([genuine, impostor])
    issame = np.concatenate([np.ones(4, bool), np.zeros(1000, bool)])
    # threshold = second-smallest impostor distance (1.001): 3 of 4 genuine are below it
    assert tar_at_far(distances, issame, 1e-3) == 0.75


def test_embedder_sums_the_flipped_view():
    """Test that the embedder returns f(x) + f(mirror x) for a linear 'backbone' (flatten)."""
    symbol = mx.sym.Flatten(mx.sym.var("data"))
    embed = Embedder(symbol, {}, {}, mx.cpu(), image_size=4, batch_size=3)
    images = np.random.default_rng(2).random((5, 3, 4, 4)).astype(np.float32)
    want = (images + images[:, :, :, ::-1]).reshape(5, -1)
    np.testing.assert_allclose(embed(images), want, rtol=1e-6)
    pairs = (np.random.default_rng(3).random((40, 4, 4, 3)) * 255).astype(np.uint8)
    issame = np.zeros(20, bool)
    issame[::2] = True
    pairs[1::4] = pairs[0::4]                  # genuine pairs are identical images
    result = evaluate(embed, pairs, issame)
    assert result.accuracy == 1.0 and result.tar_at_far == 1.0 and result.embedding_norm > 0


def test_embedder_without_flip_is_the_plain_forward():
    """Test that flip=False gives f(x) alone for a linear 'backbone' (flatten)."""
    embed = Embedder(mx.sym.Flatten(mx.sym.var("data")), {}, {}, mx.cpu(), image_size=4,
                     batch_size=3, flip=False)
    images = np.random.default_rng(4).random((4, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(embed(images), images.reshape(4, -1), rtol=1e-6)
