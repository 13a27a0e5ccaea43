"""The fixed case run by tests/parallel/workers/partial_fc_steps.py, rebuilt for the references."""
import numpy as np

from sample_fc.pfc.memory_bank import fill_initial_centers

DATA_SHAPE = (3, 4, 4)
MARGINS = (1.0, 0.5, 0.0, 8.0)      # m1, m2, m3, s used by the worker
BANK_SEED = 7


def inputs(global_batch, classes, embedding, steps):
    """(backbone init weight, data, labels, initial centers of all classes) as the worker makes them."""
    spec = np.random.default_rng(123)
    init_weight = spec.standard_normal((embedding, int(np.prod(DATA_SHAPE)))) * 0.3
    data = spec.standard_normal((steps, global_batch) + DATA_SHAPE)
    labels = spec.integers(0, classes, size=(steps, global_batch))
    centers = fill_initial_centers(np.empty((classes, embedding), np.float32), 0, BANK_SEED)
    return init_weight, data, labels, centers


def lr_of_step(base_lr):
    return lambda n: base_lr * (0.5 if n >= 2 else 1.0)   # WarmupMultiStepSchedule(lr, 0, [2], 0.5)


def load_run(prefix, world):
    """Merge the per-rank outputs: bank rows concatenated in class order, sampled ids united."""
    ranks = [dict(np.load(f"{prefix}.rank{r}.npz", allow_pickle=True)) for r in range(world)]
    merged = dict(ranks[0])
    merged["bank_weight"] = np.concatenate([r["bank_weight"] for r in ranks])
    merged["bank_momentum"] = np.concatenate([r["bank_momentum"] for r in ranks])
    steps = len(ranks[0]["sampled"])
    merged["sampled"] = [np.sort(np.concatenate([r["sampled"][t] for r in ranks])).astype(np.int64)
                         for t in range(steps)]
    merged["per_rank"] = ranks
    return merged
