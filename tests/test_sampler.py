"""Tests for sample_fc.pfc.sampler: positives kept, negatives uniform and distinct, shards exact."""
import numpy as np
import pytest

from sample_fc.pfc.sampler import (ClassCenterSampler, SampleRatioWarmup, class_center_sample,
                                   num_sample_for, sampled_decay_scales, sampled_logit_offsets, shard_range)


def test_positives_never_dropped_when_they_outnumber_num_sample():
    """Test that every local positive is sampled even when there are more than num_sample."""
    labels = np.arange(100, 160)                     # 60 distinct positives on a 100-class shard
    remapped, index = class_center_sample(labels, 100, 10, class_start=100,
                                          rng=np.random.default_rng(0))
    assert len(index) == 60
    np.testing.assert_array_equal(index[remapped], labels - 100)


def test_negatives_distinct_off_positive_and_sorted():
    """Test that the sampled set is sorted, distinct, of size num_sample, and holds all positives."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 1000, size=64)
    remapped, index = class_center_sample(labels, 500, 120, class_start=250, rng=rng)
    assert len(index) == 120 and len(np.unique(index)) == 120
    assert np.all(np.diff(index) > 0) and index.min() >= 0 and index.max() < 500
    on_shard = (labels >= 250) & (labels < 750)
    assert np.all(remapped[~on_shard] == -1)
    np.testing.assert_array_equal(index[remapped[on_shard]], labels[on_shard] - 250)


@pytest.mark.parametrize("num_sample", [30, 70])   # sparse and dense branches
def test_negatives_are_uniform(num_sample):
    """Test that every non-positive class is drawn with the same frequency (chi-square bound)."""
    rng = np.random.default_rng(2)
    labels = np.array([3, 7, 7, 50])
    counts = np.zeros(100)
    trials = 4000
    for _ in range(trials):
        _, index = class_center_sample(labels, 100, num_sample, rng=rng)
        counts[index] += 1
    positives = [3, 7, 50]
    assert np.all(counts[positives] == trials)
    free = np.delete(counts, positives)
    expected = trials * (num_sample - 3) / 97
    chi2 = ((free - expected) ** 2 / expected).sum()
    assert chi2 < 96 + 5 * np.sqrt(2 * 96), chi2   # mean 96 dof, 5 sigma


def test_uneven_shards_cover_all_classes():
    """Test that C=10 over W=3 gives shards 4,3,3 covering every class exactly once."""
    shards = [shard_range(10, r, 3) for r in range(3)]
    assert [n for _, n in shards] == [4, 3, 3]
    covered = np.concatenate([np.arange(s, s + n) for s, n in shards])
    np.testing.assert_array_equal(covered, np.arange(10))
    with pytest.raises(ValueError, match=r"num_classes \(2\).*world size \(3\)"):
        shard_range(2, 0, 3)


def test_large_labels_round_trip_exactly():
    """Test that labels up to 2**31 - 1 map to the right centers (no float32 rounding)."""
    top = 2**31 - 1
    start = top - 999
    labels = np.array([top, top - 1, start, 5], dtype=np.int64)
    remapped, index = class_center_sample(labels, 1000, 4, class_start=start,
                                          rng=np.random.default_rng(0))
    np.testing.assert_array_equal(index[remapped[:3]] + start, labels[:3])
    assert remapped[3] == -1
    assert float(np.float32(top - 1)) != top - 1     # the failure mode this guards against


def test_same_seed_same_sample_and_float_labels_rejected():
    """Test that a sampler seeded the same draws the same sets, different ranks differ."""
    labels = np.arange(8)
    a, b, c = (ClassCenterSampler(0, 10000, 500, seed=4, rank=r) for r in (0, 0, 1))
    np.testing.assert_array_equal(a(labels).index, b(labels).index)
    assert not np.array_equal(a(labels).index, c(labels).index)
    with pytest.raises(TypeError, match="float"):
        a(labels.astype(np.float32))


def test_num_sample_for():
    """Test that num_sample is ceil(ratio * num_local) and bad ratios are rejected."""
    assert num_sample_for(1001, 0.1) == 101 and num_sample_for(7, 1.0) == 7
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=str(bad)):
            num_sample_for(100, bad)


def test_sampler_speed_printed():
    """Test that sampling 1.25M local classes with 512 positives works; prints the time (target <= 10 ms)."""
    import time
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 1_250_000, size=512)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        _, index = class_center_sample(labels, 1_250_000, 125_000, rng=rng)
        times.append(time.perf_counter() - start)
    assert len(index) == 125_000
    print(f"\nsampler at 1.25M local classes, 512 positives: {np.median(times) * 1e3:.2f} ms (median of 10)")


def test_sample_ratio_warmup_follows_its_formula():
    """Test that the warm-up gives start at update 1, start + (ratio - start) (n - 1) / steps in
    between (hand-computed values), ratio from update steps + 1 on, and ratio throughout
    without a warm-up; and that its peak is the larger end."""
    schedule = SampleRatioWarmup(0.1, steps=10, start=1.0)
    assert schedule(1) == 1.0
    assert schedule(6) == pytest.approx(1.0 - 0.9 * 5 / 10)       # 0.55
    assert schedule(10) == pytest.approx(0.19)
    assert [schedule(n) for n in (11, 12, 1000)] == [0.1, 0.1, 0.1]
    assert schedule.peak() == 1.0
    assert [SampleRatioWarmup(0.3)(n) for n in (1, 5)] == [0.3, 0.3] and SampleRatioWarmup(0.3).peak() == 0.3
    assert SampleRatioWarmup(0.1, steps=4, start=0.5)(3) == pytest.approx(0.5 - 0.4 * 2 / 4)
    for bad in (dict(ratio=0.0), dict(ratio=0.1, start=1.5), dict(ratio=0.1, steps=-1), dict(ratio=0.1, steps=2.5)):
        with pytest.raises(ValueError):
            SampleRatioWarmup(**bad)


def test_sampler_under_the_schedule_keeps_every_positive():
    """Test that at every update of a warm-up from 1.0 to 0.05 the sampler's set has
    ceil(ratio * classes) rows (or every positive, when they are more) and holds every positive
    of the batch, and that without an update number it samples sample_ratio's size."""
    num_local, class_start = 1000, 5000
    schedule = SampleRatioWarmup(0.05, steps=20, start=1.0)
    sampler = ClassCenterSampler(class_start, num_local, num_sample_for(num_local, 0.05), seed=3, schedule=schedule)
    rng = np.random.default_rng(0)
    for update in range(1, 26):
        labels = rng.integers(class_start - 2000, class_start + num_local + 2000, 128)
        mine = np.unique(labels[(labels >= class_start) & (labels < class_start + num_local)]) - class_start
        sample = sampler(labels, update)
        target, index = sample.targets, sample.index
        assert len(index) == max(num_sample_for(num_local, schedule(update)), len(mine))
        assert set(mine) <= set(index.tolist())
        local = (labels >= class_start) & (labels < class_start + num_local)
        np.testing.assert_array_equal(index[target[local]], labels[local] - class_start)
    assert len(sampler(np.array([class_start])).index) == num_sample_for(num_local, 0.05)


def test_memory_plan_holds_the_warmups_peak_ratio():
    """Test that a run whose sampling warms up from 1.0 to 0.1 is planned with the rows of
    ratio 1.0 (its first steps score every center), and one without a warm-up with ratio 0.1's."""
    import default
    from sample_fc import symbols
    from sample_fc.run.memory_plan import run_plan
    cfg = default.get_config(dataset='synthetic_1m', network='mbf_small')
    symbol = symbols.get_symbol('mbf_small', cfg.embedding_size, cfg.image_size)
    plain, _ = run_plan(cfg, 2, symbol, False, False, 1)
    cfg.sample_ratio_warmup_steps = 100
    warm, _ = run_plan(cfg, 2, symbol, False, False, 1)
    assert plain.sampled == 50000 and warm.sampled == 500000 and warm.total > plain.total


@pytest.mark.parametrize("num_sample", [20, 150])   # sparse and dense branches of the sampler
def test_corrections_are_the_inverse_inclusion_frequency(num_sample):
    """Test that the sampled-softmax offsets are -log of how often each column's class is drawn,
    measured over 3,000 samples of one batch (0 for the positives, always in), and that with
    them the sampled softmax's normaliser is unbiased: its mean over the samples is the
    normaliser over all 200 classes; and that the weight-decay scales are exp(offset), so each
    class's decay summed over the samples that draw it is, per sample, 1: every class decays
    once an update on average, as when every class is scored."""
    rng = np.random.default_rng(5)
    labels = np.array([3, 3, 17, 250, 40, 199, 17, 8])           # 250 lives on another shard
    logits = rng.normal(0.0, 2.0, size=200)
    positives = [3, 8, 17, 40, 199]
    drawn, offset_of, estimates, decayed = np.zeros(200), np.full(200, np.nan), [], np.zeros(200)
    for _ in range(3000):
        target, index = class_center_sample(labels, 200, num_sample, rng=rng)
        offsets = sampled_logit_offsets(target, len(index), 200)
        scales = sampled_decay_scales(target, len(index), 200)
        np.testing.assert_allclose(scales, np.exp(offsets), rtol=1e-6)
        decayed[index] += scales
        drawn[index] += 1
        offset_of[index] = offsets
        estimates.append(np.sum(np.exp(logits[index] + offsets)))
    frequency = drawn / 3000
    negatives = np.setdiff1d(np.arange(200), positives)
    assert np.all(frequency[positives] == 1.0) and np.all(offset_of[positives] == 0.0)
    np.testing.assert_allclose(np.exp(-offset_of[negatives]), frequency[negatives].mean(), rtol=0.01)
    assert frequency[negatives].std() < 4 * np.sqrt(frequency[negatives].mean() / 3000)    # and uniform
    assert abs(np.mean(estimates) / np.sum(np.exp(logits)) - 1.0) < 0.03
    assert np.all(decayed[positives] == 3000)
    assert abs(decayed[negatives].mean() / 3000 - 1.0) < 0.01


def test_logit_offsets_are_none_when_every_class_is_scored():
    """Test that a sample holding every class of the shard (ratio 1.0, or positives and all the
    rest) needs no correction, and one with only positives has nothing to correct."""
    target = np.array([0, 2, -1, 2])
    assert sampled_logit_offsets(target, 10, 10) is None
    assert sampled_logit_offsets(target, 2, 10) is None
    np.testing.assert_allclose(sampled_logit_offsets(target, 4, 10), [0, np.log(4), 0, np.log(4)], rtol=1e-6)
    assert sampled_decay_scales(target, 10, 10) is None and sampled_decay_scales(target, 2, 10) is None
    np.testing.assert_allclose(sampled_decay_scales(target, 4, 10), [1, 4, 1, 4], rtol=1e-6)   # F / n = 8 / 2
