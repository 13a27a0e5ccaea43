"""Tests for sample_fc.verification: 10-fold accuracy, TAR@FAR, flip-summed embeddings."""
import mxnet as mx
import numpy as np

from sample_fc.verification import (Embedder, best_threshold, evaluate, kfold_accuracy,
                                    pair_distances, score, tar_at_far)


def _reference_best_threshold(distances, issame):
    """Brute force: (threshold, accuracy) of the first best of every candidate threshold,
    tried one by one in plain Python: one below the minimum, the midpoints of consecutive
    distinct distances, one above the maximum; accepted means distance < threshold."""
    values = sorted(set(float(d) for d in distances))
    candidates = [values[0] - 1.0] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1.0]
    best, best_acc = None, -1.0
    for t in candidates:
        acc = sum((float(d) < t) == bool(same) for d, same in zip(distances, issame)) / len(issame)
        if acc > best_acc:
            best, best_acc = t, acc
    return best, best_acc


def _reference_folds(distances, issame, folds=10):
    """Per fold (best training accuracy, threshold, test accuracy), with plain loops:
    contiguous folds, threshold = brute-force best on the other folds."""
    n = len(issame)
    results = []
    for k in range(folds):
        test = [i for i in range(n) if i * folds // n == k]
        train = [i for i in range(n) if i * folds // n != k]
        t, train_acc = _reference_best_threshold([distances[i] for i in train], [issame[i] for i in train])
        test_acc = sum((float(distances[i]) < t) == bool(issame[i]) for i in test) / len(test)
        results.append((train_acc, t, test_acc))
    return results


def _reference_kfold(distances, issame, folds=10):
    test_accs = [test_acc for _, _, test_acc in _reference_folds(distances, issame, folds)]
    return np.mean(test_accs), np.std(test_accs)


def _grid_kfold(distances, issame, folds=10):
    """The old search, with plain loops: the best threshold of the fixed grid 0, 0.01, .., 3.99."""
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


def _random_case(rng, n):
    """(distances, issame) of n pairs: overlapping scores, at random one of: continuous
    float64, few distinct values (many ties, genuine and impostor tied too), float32, or
    all within 1e-6 of each other."""
    issame = rng.random(n) < rng.uniform(0.2, 0.8)
    distances = np.where(issame, rng.normal(0.9, 0.4, n), rng.normal(1.4, 0.4, n)).clip(0, 4)
    kind = rng.integers(4)
    if kind == 1:
        distances = np.round(distances * 2) / 2               # values 0, 0.5, 1, ...
    elif kind == 2:
        distances = distances.astype(np.float32)
    elif kind == 3:
        distances = 1.0 + distances * 2.5e-7                 # within 1e-6
    return distances, issame


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
    """Test that the 10-fold accuracy equals a plain-loop brute-force reference on
    overlapping data."""
    rng = np.random.default_rng(1)
    issame = rng.random(200) < 0.5
    distances = np.where(issame, rng.normal(0.9, 0.3, 200), rng.normal(1.5, 0.3, 200)).clip(0, 3.99)
    mean, std = kfold_accuracy(distances, issame)
    want_mean, want_std = _reference_kfold(distances, issame)
    assert abs(mean - want_mean) < 1e-12 and abs(std - want_std) < 1e-12
    # the threshold search now runs over the observed distances, not the 0.01 grid: on this
    # data the mean moved from 0.880 (grid) to 0.845, as the grid reference still gives
    assert abs(mean - 0.845) < 1e-12 and abs(_grid_kfold(distances, issame)[0] - 0.88) < 1e-12
    assert 0.75 < mean < 0.95


def test_best_threshold_matches_brute_force_on_random_cases():
    """Test that best_threshold gives the brute-force reference's threshold and accuracy
    (trying every candidate one by one) on random cases: ties, float32, collapsed scores,
    a single pair, all genuine, all impostor."""
    rng = np.random.default_rng(7)
    for case in range(300):
        distances, issame = _random_case(rng, int(rng.integers(1, 40)))
        if case % 50 == 1:
            issame[:] = case % 100 == 1                    # one class only
        want = _reference_best_threshold(distances, issame)
        assert best_threshold(distances, issame) == want, (case, distances, issame)


def test_folds_match_brute_force_on_random_cases():
    """Test that on random cases (ties, float32, collapsed scores) every fold's best
    training accuracy and held-out accuracy, and the 10-fold mean and std, equal the
    brute-force reference's."""
    rng = np.random.default_rng(8)
    for case in range(40):
        n = int(rng.integers(10, 90))
        distances, issame = _random_case(rng, n)
        fold_of = np.arange(n) * 10 // n
        for fold, (want_train, want_t, want_test) in enumerate(_reference_folds(distances, issame)):
            train, test = fold_of != fold, fold_of == fold
            t, train_acc = best_threshold(distances[train], issame[train])
            test_acc = np.mean((distances[test].astype(np.float64) < t) == issame[test])
            assert (t, train_acc) == (want_t, want_train), (case, fold)
            assert abs(test_acc - want_test) < 1e-12, (case, fold)
        mean, std = kfold_accuracy(distances, issame)
        want_mean, want_std = _reference_kfold(distances, issame)
        assert abs(mean - want_mean) < 1e-12 and abs(std - want_std) < 1e-12, case


def test_collapsed_but_separable_distances_give_accuracy_one():
    """Test that distances all within 1e-6 of each other, genuine ones below impostors,
    give accuracy 1.0, where the old 0.01 grid cannot separate them (accuracy 0.5)."""
    rng = np.random.default_rng(9)
    issame = np.tile([True, False], 100)     # balanced folds: the grid's 0.5 is exact
    distances = 1.0 + np.where(issame, rng.uniform(0, 4e-7, 200), rng.uniform(6e-7, 1e-6, 200))
    assert distances.max() - distances.min() < 1e-6
    assert kfold_accuracy(distances, issame) == (1.0, 0.0)
    assert _grid_kfold(distances, issame) == (0.5, 0.0)      # the grid's search fails here
    threshold, accuracy = best_threshold(distances, issame)
    assert accuracy == 1.0 and distances[issame].max() < threshold < distances[~issame].min()
    # the limit: adjacent floats, whose rounded midpoint (1 + 2**-53 -> 1.0) is not above the lower
    adjacent = np.array([1.0, np.nextafter(1.0, 2.0)])
    assert (adjacent[0] + adjacent[1]) / 2 == adjacent[0]
    assert best_threshold(adjacent, [True, False]) == (adjacent[1], 1.0)


def test_score_of_near_collapsed_embeddings_agrees_with_tar_at_far():
    """Test that near-collapsed embeddings (every pair distance below 1e-7, genuine pairs
    closer than impostors) score accuracy 1.0, as TAR@FAR (1.0) read off the same distances
    says, instead of the grid's 0.5."""
    rng = np.random.default_rng(10)
    issame = np.tile([True, False], 50)
    first = np.eye(8)[0] + 1e-3 * np.outer(rng.random(100), np.eye(8)[1])
    delta = np.where(issame, rng.uniform(0.5e-4, 1e-4, 100), rng.uniform(2e-4, 3e-4, 100))
    second = first + np.outer(delta, np.eye(8)[2])
    embeddings = np.stack([first, second], axis=1).reshape(200, 8)
    distances = pair_distances(embeddings)
    assert distances.max() < 1e-7 and distances[issame].max() < distances[~issame].min()
    assert _grid_kfold(distances, issame)[0] == 0.5
    result = score(embeddings, issame)
    assert (result.accuracy, result.accuracy_std, result.tar_at_far) == (1.0, 0.0, 1.0)


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


def test_uint8_images_and_chunked_evaluation_match_the_whole_float32_set():
    """Test that the embedder takes a .bin's uint8 NHWC images (made float32 a batch at a time) with
    the same embeddings as their float32 NCHW copy, and that evaluate, which embeds a few pairs at
    a time, scores as `score` on the whole set's embeddings (distances, norms, accuracy)."""
    symbol = mx.sym.FullyConnected(mx.sym.Flatten(mx.sym.var("data")), num_hidden=6, name="fc")
    rng = np.random.default_rng(5)
    params = {"fc_weight": mx.nd.array(rng.standard_normal((6, 48))), "fc_bias": mx.nd.zeros(6)}
    embed = Embedder(symbol, params, {}, mx.cpu(), image_size=4, batch_size=3)
    pairs = (rng.random((44, 4, 4, 3)) * 255).astype(np.uint8)
    issame = rng.random(22) < 0.5
    issame[:2] = (True, False)
    whole = embed(pairs.transpose(0, 3, 1, 2).astype(np.float32))
    np.testing.assert_array_equal(embed(pairs), whole)
    assert evaluate(embed, pairs, issame, pairs_per_chunk=4) == score(whole, issame)

