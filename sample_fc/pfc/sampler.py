"""Class-center sampling: every positive of the batch plus uniform random negatives.

Runs on the host with NumPy, on integer labels only (int64 end to end: float32 would
corrupt class ids above 2**24). Cost is O(num_local) in vectorised passes over a boolean
mask, never a Python loop over labels or classes.

The fraction sampled may follow a schedule of the update number (SampleRatioWarmup: a larger
fraction first, down to sample_ratio), a pure function like the lr schedule, so a resumed run
samples as an uninterrupted one.
"""
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Sample:
    """One shard's sample for one global batch: everything the head kernels need of it.

    index: sorted distinct local rows of the bank (int64, the sampled centers);
    targets: (B,) int64, each row's position in `index`, -1 where the class is on another rank;
    logit_offsets: None, or (K,) float32 added to each column's logits (the sampled-softmax
        correction: sampled_logit_offsets; 0 on every target column);
    decay_scales: None, or (K,) float32 factors of each row's weight decay in the update (the
        weight-decay correction: sampled_decay_scales; 1 on every target column).
    A new sampling option is a field here and its use in the kernels (head.Head).
    """
    index: np.ndarray
    targets: np.ndarray
    logit_offsets: Optional[np.ndarray] = None
    decay_scales: Optional[np.ndarray] = None


def shard_range(num_classes, rank, world_size):
    """(class_start, num_local) of `rank`'s balanced shard: the first C % W ranks get one more."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if num_classes < world_size:
        raise ValueError(f"num_classes ({num_classes}) must be >= world size ({world_size}): "
                         "every rank needs at least one class center")
    base, extra = divmod(num_classes, world_size)
    num_local = base + (rank < extra)
    class_start = rank * base + min(rank, extra)
    return class_start, num_local


def num_sample_for(num_local, sample_ratio):
    """ceil(sample_ratio * num_local): the sampled set's size when positives do not exceed it."""
    if not 0.0 < sample_ratio <= 1.0:
        raise ValueError(f"sample_ratio must be in (0, 1], got {sample_ratio}")
    return min(num_local, max(1, math.ceil(sample_ratio * num_local)))


def most_rows_scored(num_local, sample_ratio, global_batch):
    """The most rows one step scores on a shard: the sample (num_sample_for), grown to every
    positive of the batch, at most the global batch's B distinct classes: min(C_r, max(n, B))."""
    return min(num_local, max(num_sample_for(num_local, sample_ratio), global_batch))


def as_int_labels(labels):
    """Labels as an int64 NumPy vector; float or fractional labels are an error, not a cast."""
    labels = np.asarray(labels.asnumpy() if hasattr(labels, "asnumpy") else labels)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"labels must be integers (int32/int64), got dtype {labels.dtype}; "
                        "float labels corrupt class ids above 2**24")
    return labels.reshape(-1).astype(np.int64, copy=False)


def class_center_sample(labels, num_local, num_sample, class_start=0, rng=None):
    """Sample this shard's class centers for a batch.

    labels: global class ids of the whole (global) batch, integers.
    num_local, class_start: this shard owns classes [class_start, class_start + num_local).
    num_sample: size of the sampled set; it grows beyond this when the batch has more
        distinct positives here (positives are never dropped).
    rng: np.random.Generator (seed it per rank), or None for a fresh unseeded one.

    Returns (remapped_labels, sampled_local_index):
      sampled_local_index: sorted int64 local indices (0-based within the shard) of the
        sampled centers = the distinct local positives plus
        max(0, num_sample - num_positives) negatives drawn uniformly without replacement
        from the other local classes.
      remapped_labels: int64, per label its position in sampled_local_index, or -1 when
        the class lives on another shard.
    """
    labels = as_int_labels(labels)
    rng = rng if rng is not None else np.random.default_rng()
    local = labels - class_start
    on_shard = (local >= 0) & (local < num_local)

    chosen = np.zeros(num_local, dtype=bool)
    chosen[local[on_shard]] = True
    num_free = num_local - int(np.count_nonzero(chosen))
    need = min(max(0, num_sample - (num_local - num_free)), num_free)
    if need <= num_free // 2:
        _mark_uniform_free(chosen, need, rng)
    else:
        # Dense case: draw the free classes to leave out instead, then take the rest.
        left_out = chosen.copy()
        _mark_uniform_free(left_out, num_free - need, rng)
        chosen |= ~left_out

    sampled_local_index = np.flatnonzero(chosen).astype(np.int64)
    remapped_labels = np.full(labels.shape, -1, dtype=np.int64)
    remapped_labels[on_shard] = np.searchsorted(sampled_local_index, local[on_shard])
    return remapped_labels, sampled_local_index


def _inverse_inclusion(target, num_sampled, num_local):
    """(positive columns, F / n) of one shard's sample: the batch's positives are always in
    (q = 1); each of the n negatives was drawn uniformly from the F classes of the shard that
    are not positives (q = n / F). None when every class is in (nothing to correct)."""
    positive_columns = np.unique(target[target >= 0])
    num_negatives = num_sampled - len(positive_columns)
    num_free = num_local - len(positive_columns)
    if num_negatives <= 0 or num_negatives >= num_free:
        return None
    return positive_columns, num_free / num_negatives


def sampled_logit_offsets(target, num_sampled, num_local):
    """The sampled-softmax correction of one shard's sample: per sampled column, log(1/q) with q
    the probability that the column was in the sample (0 for the batch's positives, log(F / n)
    for each negative: _inverse_inclusion).

    Added to the logits, the sampled softmax's normaliser becomes an unbiased estimate of the
    full softmax's, and each negative's push on its center is as large in expectation as when
    every center is scored. target: each row's column in the sample, -1 when the class is
    elsewhere; num_sampled: the sample's size; num_local: the shard's classes.
    Returns float32 (num_sampled,), or None when there is nothing to correct (every class in).
    """
    inclusion = _inverse_inclusion(target, num_sampled, num_local)
    if inclusion is None:
        return None
    positive_columns, inverse_q = inclusion
    offsets = np.full(num_sampled, math.log(inverse_q), dtype=np.float32)
    offsets[positive_columns] = 0.0
    return offsets


def sampled_decay_scales(target, num_sampled, num_local):
    """The weight-decay correction of one shard's sample: per sampled column, 1/q (1 for the
    batch's positives, F / n for each negative: _inverse_inclusion), the factor of the bank's
    weight decay on that row. A center is updated, and so decayed, only in the steps it is
    drawn in (about one in 1/q): decayed 1/q times as much each time, its expected decay per
    update is the full softmax's, where every center decays at every update.
    Returns float32 (num_sampled,), or None when there is nothing to correct (every class in).
    """
    inclusion = _inverse_inclusion(target, num_sampled, num_local)
    if inclusion is None:
        return None
    positive_columns, inverse_q = inclusion
    scales = np.full(num_sampled, inverse_q, dtype=np.float32)
    scales[positive_columns] = 1.0
    return scales


def _mark_uniform_free(taken, count, rng):
    """Set `count` more entries of the boolean mask `taken`, uniformly among the unset ones.

    Draws with replacement, rejects taken entries and repeats for what is still missing.
    The procedure commutes with any relabelling of the free entries, so the new k-subset
    is uniform over all k-subsets of them. Expected O(len(taken)) when count <= half free.
    """
    num_taken = int(np.count_nonzero(taken))
    while count > 0:
        draws = rng.integers(0, taken.size, size=count)
        taken[draws[~taken[draws]]] = True
        now = int(np.count_nonzero(taken))
        count -= now - num_taken
        num_taken = now


class SampleRatioWarmup:
    """The sample ratio of update n (1-based): `start` at update 1, linearly down (or up) to
    `ratio` at update steps + 1 and after; steps = 0: `ratio` throughout."""

    def __init__(self, ratio, steps=0, start=1.0):
        for name, value in (("ratio", ratio), ("start", start)):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"sample ratio warm-up: {name} must be in (0, 1], got {value!r}")
        if not (isinstance(steps, int) and steps >= 0):
            raise ValueError(f"sample ratio warm-up needs steps >= 0 (0 = none), got {steps!r}")
        self.ratio, self.steps, self.start = ratio, steps, start

    def __call__(self, num_update):
        if not self.steps or num_update > self.steps:
            return self.ratio
        return self.start + (self.ratio - self.start) * (max(num_update, 1) - 1) / self.steps

    def peak(self):
        """The largest ratio of the schedule (what the memory plan must hold)."""
        return max(self.ratio, self.start) if self.steps else self.ratio


class ClassCenterSampler:
    """The sampler of one rank's shard, with its own seeded random stream, and its policy.

    Seeded from (seed, rank) so ranks draw different negatives and a rerun draws the same.
    With a `schedule` (update number -> sample ratio, e.g. SampleRatioWarmup) the size of the
    sampled set follows it; else it is `num_sample` at every update. `logit_correction` and
    `decay_correction` add their vectors (sampled_logit_offsets, sampled_decay_scales) to each
    Sample.
    """

    def __init__(self, class_start, num_local, num_sample, seed=0, rank=0, schedule=None,
                 logit_correction=False, decay_correction=False):
        if not 1 <= num_sample <= num_local:
            raise ValueError(f"num_sample must be in [1, num_local={num_local}], got {num_sample}")
        self.class_start, self.num_local, self.num_sample = class_start, num_local, num_sample
        self.seed, self.rank, self.schedule = seed, rank, schedule
        self.logit_correction, self.decay_correction = logit_correction, decay_correction
        self.rng = np.random.default_rng([seed, rank])

    @classmethod
    def for_bank(cls, bank, sample_ratio, seed=0, warmup_steps=0, warmup_start=1.0, logit_correction=False,
                 decay_correction=False):
        """The sampler of a MemoryBank's shard: ceil(ratio * its classes) per step, the ratio
        sample_ratio after a warm-up of `warmup_steps` updates from `warmup_start`."""
        schedule = SampleRatioWarmup(sample_ratio, warmup_steps, warmup_start) if warmup_steps else None
        return cls(bank.class_start, bank.num_local, num_sample_for(bank.num_local, sample_ratio), seed=seed,
                   rank=bank.rank, schedule=schedule, logit_correction=logit_correction,
                   decay_correction=decay_correction)

    def num_sample_at(self, num_update):
        """The sampled set's size (before positives beyond it) at update `num_update`."""
        if self.schedule is None or num_update is None:
            return self.num_sample
        return num_sample_for(self.num_local, self.schedule(num_update))

    def __call__(self, labels, num_update=None):
        """The Sample for the global batch's integer labels at update `num_update` (1-based;
        None: no schedule)."""
        targets, index = class_center_sample(labels, self.num_local, self.num_sample_at(num_update),
                                             self.class_start, self.rng)
        return Sample(index, targets,
                      sampled_logit_offsets(targets, len(index), self.num_local) if self.logit_correction else None,
                      sampled_decay_scales(targets, len(index), self.num_local) if self.decay_correction else None)

    @staticmethod
    def bytes_needed(num_local, num_sampled):
        """Bytes of one step's sampling: a bool mask of the shard and the int64 index, plus the
        corrections' float32 logit offsets and decay scales (charged whether on or off)."""
        return 9 * num_local + 8 * num_sampled

    def state_dict(self):
        return {"bit_generator": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.rng.bit_generator.state = state["bit_generator"]
