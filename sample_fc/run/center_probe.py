"""How the class centers move: their mean norm and the mean angle a center turns per step.

Read every `period` steps (the progress lines') from a fixed set of up to PROBE_ROWS evenly
spaced rows of rank 0's shard: their values after step n - 1 and after step n. Two reads of a
few hundred kB per period, whatever the class count; no collective (rank 0 alone). The same
numbers for any matrix of centers (bench.compare's yardstick side) come from center_motion.
"""
import numpy as np

PROBE_ROWS = 1024


def probe_rows(num_rows, count=PROBE_ROWS):
    """Sorted distinct row indices, at most `count`, evenly spaced over 0..num_rows-1."""
    return np.unique(np.linspace(0, num_rows - 1, min(count, num_rows)).round().astype(np.int64))


def center_motion(before, after):
    """{'center_norm': mean L2 norm of the rows of `after`, 'center_turn_deg': mean angle in
    degrees between each row of `before` and the same row of `after`} (float32 or float64 arrays)."""
    before, after = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    norm_before, norm_after = np.linalg.norm(before, axis=1), np.linalg.norm(after, axis=1)
    cosine = np.einsum("ij,ij->i", before, after) / np.maximum(norm_before * norm_after, 1e-30)
    turn = np.degrees(np.arccos(np.clip(cosine, -1.0, 1.0)))
    return {"center_norm": float(norm_after.mean()), "center_turn_deg": float(turn.mean())}


def read_bank_rows(bank, index):
    """Rows `index` (sorted) of a MemoryBank's weights as float32 NumPy, any storage or device."""
    if bank.ctx.device_type == "cpu":
        return bank.host_rows().take_weights(index, np.empty((len(index), bank.embedding_size), np.float32))
    return bank.get(index)[0].asnumpy()


class CenterProbe:
    """A batch-end callback (rank 0): after each step n with n % period == 0, `latest` holds
    center_motion of the probe rows between steps n - 1 and n, and `scalars(n)` returns it."""

    def __init__(self, bank, period):
        self.read = lambda: read_bank_rows(bank, self.index)
        self.index, self.period = probe_rows(bank.num_local), period
        self.before, self.latest, self.latest_step = None, {}, None

    def __call__(self, info):
        if info.step % self.period == 0 and self.before is not None:
            self.latest, self.latest_step = center_motion(self.before, self.read()), info.step
        self.before = self.read() if (info.step + 1) % self.period == 0 else None

    def scalars(self, step):
        """The center statistics of step `step`, or {} when none were read then."""
        return dict(self.latest) if step == self.latest_step else {}
