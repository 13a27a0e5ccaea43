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
floor(|x| / 2^-24 + u) spacings, u uniform in [0, 1), which is unbiased too. The noise is given by the caller as
a pure function of (seed, update, rows) (`noise`), so a resumed run rounds exactly as an
uninterrupted one. NDArrays (the device kernel) are rounded through the same NumPy code.
"""
import numpy as np

DROPPED_BITS = 13                     # float32 mantissa (23) - float16 mantissa (10)
KEEP_MASK = np.uint32(0xFFFFFFFF ^ ((1 << DROPPED_BITS) - 1))


def stochastic_round_to_float16(x, noise_bits):
    """float16 values of float32 `x` (a NumPy array, or an NDArray: rounded on the host and
    returned on its context), rounded up or down at random with the probabilities that keep
    the mean; `noise_bits`: uint32 noise in [0, 2^13) of x's shape (`noise`). Integer
    operations only (NumPy's float16 conversion is slow, most of all for subnormals)."""
    if not isinstance(x, np.ndarray):
        import mxnet as mx
        return mx.nd.array(stochastic_round_to_float16(x.asnumpy(), noise_bits), ctx=x.context, dtype="float16")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    sign = (bits >> 16) & np.uint32(0x8000)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    # normal range: add the noise below the kept bits, clear them, re-bias the exponent (127 -> 15)
    kept = (magnitude + noise_bits) & KEEP_MASK
    exponent = kept >> np.uint32(23)
    half = ((exponent - np.uint32(112)) << np.uint32(10)) | ((kept >> np.uint32(DROPPED_BITS)) & np.uint32(0x3FF))
    half = np.where(exponent >= 143, np.uint32(0x7C00), half)                 # beyond float16: inf
    # subnormal range: k = floor(|x| / 2^-24 + u), u = noise / 2^13 in [0, 1)
    tiny = magnitude < np.uint32(0x38800000)                                  # |x| < 2^-14
    if tiny.any():
        scaled = np.abs(x[tiny]) * np.float32(1 << 24) + noise_bits[tiny] * np.float32(1.0 / (1 << DROPPED_BITS))
        half[tiny] = np.floor(scaled).astype(np.uint32)
    return (half | sign).astype(np.uint16).view(np.float16)


def noise(seed, num_update, first_class, stream, shape):
    """uint32 noise in [0, 2^13) for the rows written at update `num_update` starting at class
    `first_class` (stream 0: weights, 1: momentum): the same numbers whatever the threads or a
    resume."""
    rng = np.random.default_rng([seed, num_update, first_class, stream])
    return rng.integers(0, 1 << DROPPED_BITS, size=shape, dtype=np.uint32)
