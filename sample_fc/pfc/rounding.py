"""Unbiased (stochastic) rounding of float32 values to float16, for banks stored in half precision.

A float16 bank keeps its weights and momentum in half precision while the head's math runs in
float32 on the sampled rows. Writing the updated rows back by round-to-nearest would lose every
update smaller than half a float16 spacing (about 2^-11 relative: a center entry of 0.01 has a
spacing of 7.6e-6, while late-training steps are often smaller), so such a class would never
move. Stochastic rounding keeps the expectation: x between its float16 neighbours lo < x < hi
becomes hi with probability (x - lo) / (hi - lo), else lo, so E[round(x)] = x and small updates
accumulate on average.

How, for float16's normal range (|x| >= 2^-14): float32 has 13 more mantissa bits than float16.
Adding a uniform random integer in [0, 2^13) to x's bit pattern and clearing those 13 bits
truncates the magnitude to float16 precision, rounding it up (a carry into the kept bits, or
the exponent) with probability exactly (dropped bits) / 2^13: unbiased, and one integer add and
one mask per value. Below 2^-14 float16 is subnormal (fixed spacing 2^-24): there the result is
floor(|x| / 2^-24 + u) spacings, u = noise / 2^13, computed exactly in integers.

The noise of entry (class, column) written at update n is a pure function of (seed, n, stream,
class, column) (`rounding_key`, `noise`): splitmix64's finalizer of the row's key and the
column's group of four gives 64 bits, 16 per column, of which 13 are used (all 16 by the int8
momentum of momentum_codec.py). So a resumed run rounds exactly as an uninterrupted one,
whatever the threads, row blocks or kernel.

This module holds the definitions in NumPy. `take_rows`, `put_rows` and `round_rows` are what
the heads call: the C extension sample_fc.pfc._half_rows (built by setup.py; tests hold it to these
definitions bit for bit) or, when it was not built, the NumPy code here.
"""
import logging

import numpy as np

try:
    from . import _half_rows
except ImportError:            # built by `pip install -e .` (scripts/bootstrap.sh); NumPy otherwise
    _half_rows = None

DROPPED_BITS = 13                     # float32 mantissa (23) - float16 mantissa (10)
KEEP_MASK = np.uint32(0xFFFFFFFF ^ ((1 << DROPPED_BITS) - 1))
GOLDEN = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_warned = []                          # the kinds of rows warned about


def _mix(z):
    """splitmix64's finalizer on uint64 NumPy arrays (wrapping arithmetic)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _mix_int(value):
    return int(_mix(np.array([value & _MASK64], dtype=np.uint64))[0])


def rounding_key(seed, num_update, stream):
    """The key of the rows written at update `num_update` (stream 0: weights, 1: momentum)."""
    key = _mix_int(seed + GOLDEN)
    key = _mix_int(key ^ ((num_update + GOLDEN) & _MASK64))
    return _mix_int(key ^ ((stream + GOLDEN) & _MASK64))


def noise(key, classes, width, bits=DROPPED_BITS):
    """uint32 noise in [0, 2^bits) for rows of `classes` (global class ids) and `width` columns:
    the low `bits` (at most 16) of each column's 16-bit lane; 13 for float16 rounding, 16 for
    int8 momentum (momentum_codec)."""
    if not 1 <= bits <= 16:
        raise ValueError(f"noise has 1 to 16 bits per column, got {bits}")
    with np.errstate(over="ignore"):
        rows = _mix(np.uint64(key) ^ (np.asarray(classes, dtype=np.int64).astype(np.uint64) * np.uint64(GOLDEN)))
        groups = np.arange((width + 3) // 4, dtype=np.uint64) * np.uint64(GOLDEN)
        words = _mix(rows[:, None] + groups[None, :])
    lanes = (words[:, :, None] >> (np.arange(4, dtype=np.uint64) * np.uint64(16))) & np.uint64((1 << bits) - 1)
    return lanes.reshape(len(rows), -1)[:, :width].astype(np.uint32)


def stochastic_round_to_float16(x, noise_bits):
    """float16 values of float32 NumPy `x`, rounded up or down at random with the
    probabilities that keep the mean; `noise_bits`: uint32 noise in [0, 2^13) of x's shape.
    Integer operations only."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    noise_bits = noise_bits.astype(np.uint32)
    sign = (bits >> 16) & np.uint32(0x8000)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    # normal range: add the noise below the kept bits, clear them, re-bias the exponent (127 -> 15)
    kept = (magnitude + noise_bits) & KEEP_MASK
    exponent = kept >> np.uint32(23)
    half = ((exponent - np.uint32(112)) << np.uint32(10)) | ((kept >> np.uint32(DROPPED_BITS)) & np.uint32(0x3FF))
    half = np.where(exponent >= 143, np.uint32(0x7C00), half)                 # beyond float16: inf
    # subnormal range: k = floor(|x| 2^24 + noise / 2^13) = ((mantissa >> shift) + noise) >> 13
    tiny = magnitude < np.uint32(0x38800000)                                  # |x| < 2^-14
    if tiny.any():
        e = (magnitude[tiny] >> np.uint32(23)).astype(np.int64)
        mantissa = (magnitude[tiny] & np.uint32(0x7FFFFF)) | np.where(e > 0, np.uint32(0x800000), np.uint32(0))
        shift = np.clip(113 - np.maximum(e, 1), 0, 31).astype(np.uint32)
        half[tiny] = ((mantissa >> shift) + noise_bits[tiny]) >> np.uint32(DROPPED_BITS)
    half = np.where(magnitude > np.uint32(0x7F800000), np.uint32(0x7E00), half)   # NaN stays NaN
    return (half | sign).astype(np.uint16).view(np.float16)


# ---- what the heads call: the C extension, or the definitions above ------------------------
def warn_numpy_fallback(what="is not built", rows="float16 bank rows"):
    """Warn once per kind of rows that sample_fc.pfc._half_rows (`what`) and its rows take NumPy's path."""
    if rows not in _warned:
        _warned.append(rows)
        logging.getLogger(__name__).warning(
            f"sample_fc.pfc._half_rows {what}: {rows} use the slow NumPy path "
            "(re-run scripts/bootstrap.sh, or pip install -e . with a C compiler)")


def int64_rows(rows):
    """Row indices (or class ids) as the C-contiguous int64 array the kernel reads."""
    return np.ascontiguousarray(rows, dtype=np.int64)


def take_rows(block, rows, out):
    """out (float32, n x D, C-contiguous) = rows `rows` of the float16 `block` (C-contiguous)."""
    rows = int64_rows(rows)
    if _half_rows is None:
        warn_numpy_fallback()
        out[...] = block[rows]
        return out
    _half_rows.take(block.view(np.uint16), block.shape[0], block.shape[1], rows, out)
    return out


def put_rows(block, rows, values, classes, key):
    """Rows `rows` of the float16 `block` = float32 `values`, stochastically rounded with the
    noise of (`key`, `classes`)."""
    rows, classes = int64_rows(rows), int64_rows(classes)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if _half_rows is None:
        warn_numpy_fallback()
        block[rows] = stochastic_round_to_float16(values, noise(key, classes, values.shape[1]))
        return
    _half_rows.put(block.view(np.uint16), block.shape[0], block.shape[1], rows, values, classes, key)


def round_rows(values, classes, key):
    """float16 copy of float32 rows `values` of `classes`, stochastically rounded."""
    values, classes = np.ascontiguousarray(values, dtype=np.float32), int64_rows(classes)
    if _half_rows is None:
        warn_numpy_fallback()
        return stochastic_round_to_float16(values, noise(key, classes, values.shape[1]))
    out = np.empty(values.shape, dtype=np.float16)
    _half_rows.round_rows(values, values.shape[1], classes, key, out.view(np.uint16))
    return out
