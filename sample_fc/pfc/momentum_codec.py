"""8-bit rows of a class-center bank: its momentum (bank_momentum=int8) and its centers
(bank_dtype=int8) as blocks of int8 codes, each with a float32 scale, written with stochastic
rounding. Below, "momentum" m stands for either.

A momentum row of width D is cut into blocks of QBLOCK = 64 columns (the last block of a row is
shorter when D % 64 != 0). Block j of a row stores one float32 scale and an int8 code per column:
    scale_j = max |m| over the block / 127                   (float32 division)
    c       = clamp(floor(m / scale_j + u), -127, 127)      (m / scale_j and + u in float32)
    decoded = float32(c) * scale_j
with u = n / 2^16 (exact in float32) and n the entry's 16 bits of rounding.noise (key
rounding_key(seed, num_update, 1), the momentum's stream, as a float16 bank's momentum). So
E[c] = m / scale_j up to 2^-16 of a code (and the float32 rounding of the sum), and every
decoded entry of a block with scale_j > 0 is within one scale_j of m. A block whose scale is 0
(all zeros, or a max too small to survive the division) stores codes 0: nothing is divided by
0. A row is
D + 4 ceil(D / 64) bytes: 544 at D 512, against 2048 as float32.

Non-finite momentum (NaN or inf anywhere in a row being written) is refused with a ValueError
naming the class, before any row of the call is written.

This module holds the definitions in NumPy (`encode`, `decode`). `take_rows` and `put_rows` are
what the host kernel calls: the C extension sample_fc.pfc._half_rows (built by setup.py; tests hold
it to these definitions bit for bit) or, when it was not built, the NumPy code here.
"""

import numpy as np

from .rounding import int64_rows, noise, warn_numpy_fallback

try:
    from . import _half_rows
except ImportError:            # built by `pip install -e .` (scripts/bootstrap.sh); NumPy otherwise
    _half_rows = None
# the extension's int8 functions, or None (not built, or built before they existed)
_kernel = _half_rows if hasattr(_half_rows, "put_int8") else None

QBLOCK = 64                    # momentum columns sharing one scale
CODE_LIMIT = 127               # codes are in [-127, 127] (symmetric: -128 is never written)
NOISE_BITS = 16                # noise bits per code: u = noise / 2^16


def scale_columns(width):
    """The scales of a row of `width` columns: one per QBLOCK columns, ceil(width / 64)."""
    return -(-width // QBLOCK)


def _per_column(scales, width):
    """(n, width) float32: each column's block scale."""
    return np.repeat(scales, QBLOCK, axis=1)[:, :width]


def block_scales(values):
    """float32 scales (n, ceil(D / 64)) of float32 rows `values` (n, D): max |m| of a block / 127."""
    n, width = values.shape
    magnitudes = np.zeros((n, scale_columns(width) * QBLOCK), dtype=np.float32)
    magnitudes[:, :width] = np.abs(values)          # the padding's zeros never raise a max
    return magnitudes.reshape(n, -1, QBLOCK).max(axis=2) / np.float32(CODE_LIMIT)


def encode(values, noise_bits):
    """(int8 codes (n, D), float32 scales (n, ceil(D / 64))) of finite float32 rows `values`
    (n, D); `noise_bits`: uint32 noise in [0, 2^16) of the values' shape."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    scales = block_scales(values)
    divisor = _per_column(scales, values.shape[1])
    empty = divisor == 0
    u = noise_bits.astype(np.float32) * np.float32(2.0 ** -NOISE_BITS)
    codes = np.floor(values / np.where(empty, np.float32(1), divisor) + u)
    codes = np.clip(codes, -CODE_LIMIT, CODE_LIMIT)
    codes[empty] = 0
    return codes.astype(np.int8), scales


def decode(codes, scales):
    """float32 momentum rows (n, D) of int8 `codes` (n, D) and their float32 `scales`."""
    return codes.astype(np.float32) * _per_column(np.asarray(scales, dtype=np.float32), codes.shape[1])


WHAT = {"momentum": "the momentum", "weight": "the center"}    # an array's rows, as an error names them


def check_finite(values, classes, what="momentum"):
    """ValueError naming the class of the first row of `values` with a NaN or inf."""
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        raise ValueError(f"{WHAT[what]} of class {int(classes[np.argmax(bad)])} is not finite (NaN or inf): "
                         f"it cannot be stored as int8")


# ---- what the host kernel calls: the C extension, or the definitions above ----------------
def _numpy_fallback():
    warn_numpy_fallback("is not built (or predates int8 momentum)", "int8 momentum rows")


def take_rows(codes, scales, rows, out):
    """out (float32, n x D, C-contiguous) = the decoded momentum of rows `rows` of one row block:
    int8 `codes` (block rows x D) and float32 `scales` (block rows x ceil(D / 64)), C-contiguous."""
    rows = int64_rows(rows)
    if _kernel is None:
        _numpy_fallback()
        out[...] = decode(codes[rows], scales[rows])
        return out
    _kernel.take_int8(codes, scales, codes.shape[0], codes.shape[1], rows, out)
    return out


def put_rows(codes, scales, rows, values, classes, key, what="momentum"):
    """Rows `rows` of one row block (`codes`, `scales`) = float32 rows `values` (of `what`, a key
    of WHAT), encoded with the noise of (`key`, `classes`); ValueError naming the class of a
    non-finite row, with nothing written."""
    rows, classes = int64_rows(rows), int64_rows(classes)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if _kernel is None:
        _numpy_fallback()
        if len(rows) and (rows.min() < 0 or rows.max() >= len(codes)):
            bad = rows[(rows < 0) | (rows >= len(codes))][0]
            raise IndexError(f"row {bad} of a block of {len(codes)} rows")
        check_finite(values, classes, what)
        codes[rows], scales[rows] = encode(values, noise(key, classes, values.shape[1], NOISE_BITS))
        return
    try:
        _kernel.put_int8(codes, scales, codes.shape[0], codes.shape[1], rows, values, classes, key)
    except ValueError as error:       # the extension's line names the momentum
        raise ValueError(str(error).replace(WHAT["momentum"], WHAT[what], 1)) from None
