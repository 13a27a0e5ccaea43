"""The sampling-fidelity benchmark's numbers against independent references."""
import numpy as np

from bench.sampling_fidelity import (center_alignment, describe, embedding_gradient, fidelity,
                                               full_logits, history_residual_share, inclusion_variances,
                                               negatives_spread, summed_relative_error, top_energy_share)
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.pfc.sampler import shard_range

from reference import normalize, softmax_loss_rows

M1, M2, M3, S = 1.0, 0.3, 0.1, 8.0


def _case(rows=6, classes=40, dim=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(rows, dim)), rng.integers(0, classes, rows), rng.normal(size=(classes, dim))


def test_full_gradient_is_the_finite_difference_of_the_loss():
    embeddings, labels, centers = _case()
    e, w = normalize(embeddings), normalize(centers)
    margin = CombinedMargin(M1, M2, M3, S)
    logits, slope = full_logits(e, w, labels, margin)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    grad = embedding_gradient(p, w, labels, slope, S)
    step, numeric = 1e-6, np.zeros_like(e)
    for d in range(e.shape[1]):
        shift = np.zeros_like(e)
        shift[:, d] = step
        up, _ = softmax_loss_rows((e + shift) @ w.T, labels, M1, M2, M3, S)
        down, _ = softmax_loss_rows((e - shift) @ w.T, labels, M1, M2, M3, S)
        numeric[:, d] = (up - down) / (2 * step)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


def test_ratio_one_samples_every_center_and_matches_the_full_softmax():
    embeddings, labels, centers = _case(rows=12)
    shards = [shard_range(len(centers), r, 3) for r in range(3)]
    stats = fidelity(embeddings, labels, centers, shards, CombinedMargin(M1, M2, M3, S), 1.0, 4, 2,
                     np.random.default_rng(1))
    assert np.max(stats["relative_error"]) < 1e-20
    np.testing.assert_allclose(stats["cosine"], 1.0, rtol=1e-12)
    expected, _ = softmax_loss_rows(normalize(embeddings) @ normalize(centers).T, labels, M1, M2, M3, S)
    assert abs(stats["loss"] - expected.mean()) < 1e-10
    assert stats["summed_relative_error"] < 1e-20


def test_sampled_gradient_differs_and_its_mean_over_draws_is_closer():
    embeddings, labels, centers = _case(rows=8, classes=200)
    shards = [shard_range(len(centers), r, 2) for r in range(2)]
    stats = fidelity(embeddings, labels, centers, shards, CombinedMargin(M1, M2, M3, S), 0.2, 8, 400,
                     np.random.default_rng(2))
    assert np.mean(stats["relative_error"]) > 1e-3            # one draw is not the full softmax
    assert np.mean(stats["bias"]) < 0.2 * np.mean(stats["relative_error"])


def test_negatives_spread_of_uniform_and_one_hot_rows():
    labels = np.array([0, 3])
    uniform = np.full((2, 5), 0.2)
    count, share = negatives_spread(uniform, labels)
    np.testing.assert_allclose(count, 4.0)
    np.testing.assert_allclose(share, 0.25)
    peaked = np.array([[0.5, 0.5, 0, 0, 0], [0, 0, 0, 0.1, 0.9]])
    count, share = negatives_spread(peaked, labels)
    np.testing.assert_allclose(count, 1.0)
    np.testing.assert_allclose(share, 1.0)


def test_center_alignment_of_a_hand_computed_case():
    embeddings = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, -1.0]])
    labels = np.array([0, 0, 1, 1])
    centers = np.array([[2.0, 0.0], [0.0, -1.0], [5.0, 5.0]])
    aligned, accuracy, norm = center_alignment(embeddings, labels, centers, [0, 1])
    # class means (normalised): (1, 1)/sqrt2 and (-1, -1)/sqrt2; centers (1, 0) and (0, -1)
    np.testing.assert_allclose(aligned, np.sqrt(0.5))
    assert accuracy == 1.0
    np.testing.assert_allclose(norm, (2.0 + 1.0 + np.sqrt(50.0)) / 3)


def test_inclusion_variances_of_hand_computed_pools():
    # 2 of [3, 1, 1, 1]: uniform q 1/2 -> 12 * (2 - 1); best q (1, 1/3, 1/3, 1/3) -> 3 * 1 * (3 - 1)
    best, uniform = inclusion_variances([3.0, 1.0, 1.0, 1.0], 2)
    np.testing.assert_allclose([best, uniform], [6.0, 12.0])
    # 2 of [10, 1, 1]: the 10 would get q 5/3, so it is in with certainty, the others q 1/2
    best, uniform = inclusion_variances([1.0, 10.0, 1.0], 2)
    np.testing.assert_allclose([best, uniform], [2.0, 102.0 * 0.5])
    # equal pushes: the uniform draw is the best one
    best, uniform = inclusion_variances(np.full(8, 0.5), 3)
    np.testing.assert_allclose(best, uniform)
    assert inclusion_variances([1.0, 2.0], 2) == (0.0, 0.0)
    best, uniform = inclusion_variances([4.0, 0.0, 0.0], 1)             # the one push drawn surely
    np.testing.assert_allclose([best, uniform], [0.0, 16.0 * 2])


def test_best_draw_variance_share_is_below_one_when_pushes_differ():
    embeddings, labels, centers = _case(rows=8, classes=200)
    shards = [shard_range(len(centers), r, 2) for r in range(2)]
    stats = fidelity(embeddings, labels, centers, shards, CombinedMargin(M1, M2, M3, S), 0.2, 8, 1,
                     np.random.default_rng(2))
    assert 0.0 < stats["best_draw_variance_share"] < 0.999


def test_summed_relative_error_of_a_hand_computed_batch():
    reference = np.array([[1.0, 0.0], [-1.0, 0.5]])
    shared = reference + np.array([0.1, 0.0])                  # both rows off the same way
    np.testing.assert_allclose(summed_relative_error(shared, reference), 0.2 ** 2 / 0.5 ** 2)
    opposed = reference + np.array([[0.1, 0.0], [-0.1, 0.0]])  # the rows' errors cancel
    assert summed_relative_error(opposed, reference) == 0.0


def test_history_residual_share_of_hand_computed_and_random_pushes():
    # one center, pushes [1, 0] then [0, 1]: each predicted by the other, residual 2 + 2 of energy 2
    pushes = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    np.testing.assert_allclose(history_residual_share(pushes.sum(0), np.sum(pushes ** 2), 2), 2.0)
    same = np.array([[[1.0, 2.0]], [[1.0, 2.0]], [[1.0, 2.0]]])
    np.testing.assert_allclose(history_residual_share(same.sum(0), np.sum(same ** 2), 3), 0.0, atol=1e-12)
    pushes = np.random.default_rng(3).normal(size=(5, 7, 3))          # 5 batches, 7 centers
    loop = sum(np.sum((pushes[t] - np.delete(pushes, t, axis=0).mean(axis=0)) ** 2) for t in range(5))
    np.testing.assert_allclose(history_residual_share(pushes.sum(0), np.sum(pushes ** 2), 5),
                               loop / np.sum(pushes ** 2))
    assert np.isnan(history_residual_share(pushes[0], np.sum(pushes[0] ** 2), 1))


def test_top_energy_share_of_a_hand_computed_pool():
    np.testing.assert_allclose(top_energy_share([10.0] + [1.0] * 99), 100.0 / 199.0)
    np.testing.assert_allclose(top_energy_share([3.0, 4.0]), 16.0 / 25.0)     # at least one center
    np.testing.assert_allclose(top_energy_share(np.ones(300), 0.01), 3.0 / 300.0)


def test_pushes_repeated_batch_for_batch_are_predicted_exactly():
    embeddings, labels, centers = _case(rows=4, classes=30)
    embeddings, labels = np.concatenate([embeddings] * 3), np.concatenate([labels] * 3)   # 3 equal batches
    shards = [shard_range(len(centers), r, 2) for r in range(2)]
    stats = fidelity(embeddings, labels, centers, shards, CombinedMargin(M1, M2, M3, S), 0.5, 4, 1,
                     np.random.default_rng(2))
    np.testing.assert_allclose(stats["history_residual_share"], 0.0, atol=1e-9)
    embeddings[4:8] *= -1.0                                               # the second batch differs
    stats = fidelity(embeddings, labels, centers, shards, CombinedMargin(M1, M2, M3, S), 0.5, 4, 1,
                     np.random.default_rng(2))
    assert stats["history_residual_share"] > 0.1


def test_one_batch_says_history_needs_two():
    embeddings, labels, centers = _case(rows=4, classes=30)
    shards = [shard_range(len(centers), r, 2) for r in range(2)]
    margin = CombinedMargin(M1, M2, M3, S)
    one = fidelity(embeddings, labels, centers, shards, margin, 0.5, 4, 1, np.random.default_rng(2))
    assert np.isnan(one["history_residual_share"])
    assert "needs two batches" in describe(one, 0.5, 1)
    two = fidelity(np.concatenate([embeddings] * 2), np.concatenate([labels] * 2), centers, shards, margin,
                   0.5, 4, 1, np.random.default_rng(2))
    assert "other batches leaves 0.000 of their energy" in describe(two, 0.5, 1)
