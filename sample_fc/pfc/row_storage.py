"""How a bank shard's rows are stored, and read as float32 and written back: the one module that
knows the storage formats. A bank's format is one value, `Storage(weights, momentum)`; the heads
ask for rows and hand them back, and never branch on a format.

Weights are float32; float16 written with stochastic rounding (rounding.py); or int8, codes of
the row plus a float32 scale per 64 columns written with stochastic rounding (momentum_codec.py's
8-bit rows, the host kernel's only). The momentum is stored as `Storage.momentum` says: `same` as
the weights; `int8`, 8-bit rows as above; `none`, no momentum (the bank's SGD runs without it). A
new format is its word in options (BANK_DTYPES or BANK_MOMENTA) and its branches here:
Storage.arrays, decoded, HostRows and DeviceRows.

Writes that round draw their noise from rounding_key(seed, num_update, stream): stream 0 the
weights, stream 1 the momentum, per class, so a run repeats whatever the split of its rows.
"""
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from . import momentum_codec
from ..options import BANK_DTYPES, BANK_MOMENTA
from .rounding import put_rows, round_rows, rounding_key, take_rows

WEIGHT_STREAM, MOMENTUM_STREAM = 0, 1    # rounding noise streams
INITIAL_UPDATE = 0                       # the update number of the initial centers' rounding noise
# every row array a shard may hold (checkpoint.layout names a file for each)
ROW_ARRAYS = ("weight", "weight_scale", "momentum", "momentum_scale")


@dataclass(frozen=True)
class Storage:
    """How a bank stores a class's row: `weights` one of BANK_DTYPES, `momentum` one of
    BANK_MOMENTA. Its checkpoint words (`meta`) are those a shard's meta file has always held."""
    weights: str = "float32"
    momentum: str = "same"

    def __post_init__(self):
        if self.weights not in BANK_DTYPES:
            raise ValueError(f"bank weights must be stored as one of {BANK_DTYPES}, got {self.weights!r}")
        if self.momentum not in BANK_MOMENTA:
            raise ValueError(f"momentum storage must be one of {BANK_MOMENTA}, got {self.momentum!r}")
        if self.weights == "int8" and self.momentum == "same":      # stored as the weights: 8-bit rows
            object.__setattr__(self, "momentum", "int8")

    @classmethod
    def of(cls, settings):
        """The storage a config or PartialFCOptions names (bank_dtype, bank_momentum)."""
        return cls(settings.bank_dtype, settings.bank_momentum)

    @classmethod
    def from_meta(cls, meta):
        """The storage of a saved shard's meta (or a saved config's keys); shards saved before
        the momentum had a format stored it as the weights. ValueError for unknown words."""
        return cls(meta.get("dtype", meta.get("bank_dtype", "float32")),
                   meta.get("momentum_storage", meta.get("bank_momentum", "same")))

    def meta(self):
        return {"dtype": self.weights, "momentum_storage": self.momentum}

    def arrays(self, embedding_size):
        """{name: (dtype, columns)} of the row arrays a shard stores, named as its checkpoint files
        (checkpoint.layout.bank_shard_files): "weight"; then "momentum" like the weights (same),
        or "momentum" int8 codes and "momentum_scale" float32 per 64 columns (int8), or no
        momentum (none)."""
        scales = (np.dtype(np.float32), momentum_codec.scale_columns(embedding_size))
        arrays = {"weight": (np.dtype(self.weights), embedding_size)}
        if self.weights == "int8":
            arrays["weight_scale"] = scales
        if self.momentum == "same":
            arrays["momentum"] = (np.dtype(self.weights), embedding_size)
        elif self.momentum == "int8":
            arrays["momentum"] = (np.dtype(np.int8), embedding_size)
            arrays["momentum_scale"] = scales
        return arrays

    def row_bytes(self, embedding_size):
        """Bytes of one class: its weights and its momentum as stored (at D 512: 4096 for float32
        + same, 2592 + int8, 2048 + none; float16: 2048, 1568, 1024; int8: 1088, 544 + none)."""
        return sum(kind.itemsize * columns for kind, columns in self.arrays(embedding_size).values())

    @property
    def device_readable(self):
        """Whether the device kernel (MXNet operators on the bank's context) reads and writes
        it: weights as floats, momentum as the weights or none. Every format is the host kernel's."""
        return self.weights != "int8" and self.momentum in ("same", "none")

    @property
    def rounds(self):
        """Whether a write rounds (and so draws noise): anything but float32 weights and momentum."""
        return self.weights != "float32" or self.momentum == "int8"

    @property
    def in_place(self):
        """Whether the stored rows are the float32 rows the math uses (no conversion)."""
        return self.weights == "float32" and self.momentum == "same"

    def device_readable_instead(self):
        """The setting that would make it the device kernel's too (for an error's way out)."""
        return "bank_dtype=float16 (or float32)" if self.weights == "int8" else "bank_momentum=same (or none)"

    def describe(self):
        """The config's words for what makes it the host kernel's alone (bank_momentum=int8), or
        for all of it (bank_dtype=..., bank_momentum=...) when the device kernel reads it."""
        if self.weights == "int8":
            return "bank_dtype=int8"
        if not self.device_readable:
            return f"bank_momentum={self.momentum}"
        return f"bank_dtype={self.weights}, bank_momentum={self.momentum}"


def decoded(arrays, storage, shape):
    """(weight, momentum) as float32 NumPy from a shard's row arrays ({name: NumPy rows}, as
    storage.arrays names them): the momentum the optimizer sees, zeros of `shape` for none."""
    weight = arrays["weight"]
    if storage.weights == "int8":
        weight = momentum_codec.decode(weight, arrays["weight_scale"])
    if storage.momentum == "none":
        return weight, np.zeros(shape, dtype=np.float32)
    if storage.momentum == "int8":
        return weight, momentum_codec.decode(arrays["momentum"], arrays["momentum_scale"])
    return weight, arrays["momentum"]


class HostRows:
    """A CPU bank's rows for the host kernel: NumPy views of its blocks (`views`: {name: [block
    views]}, the bank's row arrays), read into float32 buffers and written back as stored."""

    def __init__(self, bank, views):
        self.bank, self.views = bank, views
        self.half = bank.storage.weights == "float16"
        self.int8 = bank.storage.weights == "int8"
        self.momentum = bank.storage.momentum     # how the momentum is stored: same | int8 | none

    def whole(self):
        """(weights, momentum) of the shard in place when they need no conversion (one float32
        block, momentum as the weights): the host kernel's ratio-1 path. Else None."""
        if len(self.views["weight"]) == 1 and self.bank.storage.in_place:
            return self.views["weight"][0], self.views["momentum"][0]
        return None

    def keys(self, num_update):
        """The rounding keys of update `num_update` (weights, momentum); None when nothing rounds."""
        return [rounding_key(self.bank.seed, num_update, stream) if self.bank.storage.rounds else None
                for stream in (WEIGHT_STREAM, MOMENTUM_STREAM)]

    def take_weights(self, index, out):
        """out (float32) = weight rows `index` (sorted)."""
        if self.int8:
            return self._take_int8("weight", index, out)
        return self._take(self.views["weight"], index, out)

    def put_weights(self, index, values, key):
        """Weight rows `index` (sorted) = float32 `values` (float16, int8: rounded with `key`)."""
        if self.int8:
            self._put_int8("weight", index, values, key)
        else:
            self._put(self.views["weight"], index, values, key)

    def take_momentum(self, index, out):
        """The float32 momentum of rows `index` (sorted) in `out`, or None without momentum."""
        if self.momentum == "none":
            return None
        if self.momentum == "same":
            return self._take(self.views["momentum"], index, out)
        return self._take_int8("momentum", index, out)

    def put_momentum(self, index, values, key):
        """Momentum rows `index` (sorted) = float32 `values`, as stored; nothing without momentum."""
        if self.momentum == "same":
            self._put(self.views["momentum"], index, values, key)
        elif self.momentum == "int8":
            self._put_int8("momentum", index, values, key)

    def _take_int8(self, name, index, out):
        """out (float32) = the decoded 8-bit rows `index` (sorted) of array `name` and its scales."""
        for block, positions, rows in self.bank.block_slices(index):
            momentum_codec.take_rows(self.views[name][block], self.views[name + "_scale"][block], rows,
                                     out[positions])
        return out

    def _put_int8(self, name, index, values, key):
        for block, positions, rows in self.bank.block_slices(index):
            momentum_codec.put_rows(self.views[name][block], self.views[name + "_scale"][block], rows,
                                    values[positions], self._classes(block, rows), key, what=name)

    def _take(self, blocks, index, out):
        """out (float32) = rows `index` (sorted) of row blocks stored as the weights are."""
        for block, positions, rows in self.bank.block_slices(index):
            if self.half:
                take_rows(blocks[block], rows, out[positions])
            else:
                np.take(blocks[block], rows, axis=0, mode="clip", out=out[positions])
        return out

    def _put(self, blocks, index, values, key):
        for block, positions, rows in self.bank.block_slices(index):
            if self.half:
                put_rows(blocks[block], rows, values[positions], self._classes(block, rows), key)
            else:
                blocks[block][rows] = values[positions]

    def _classes(self, block, rows):
        return rows + (self.bank.class_start + self.bank.starts[block])


class DeviceRows:
    """A bank's rows for the device kernel, on the bank's context: float32 copies of the sampled
    weight and momentum rows (None without momentum), written back as stored (float16: rounded on
    the host). The momentum must be stored as the weights or not at all (int8 is the host kernel's)."""

    def __init__(self, bank):
        if not bank.storage.device_readable:
            raise ValueError(f"this shard is stored as {bank.storage.describe()}: only the host kernel reads it")
        self.bank = bank

    def take(self, index):
        """(weight rows, momentum rows or None) of `index` (sorted, NumPy) as float32 NDArrays."""
        return tuple(None if rows is None else rows.astype("float32", copy=False) for rows in self.bank.get(index))

    def put(self, index, weight, momentum, num_update):
        """Rows `index` = float32 `weight`, `momentum` (NDArrays; None without momentum); a float16
        bank gets them stochastically rounded with update `num_update`'s noise."""
        if self.bank.storage.weights == "float16":
            classes = np.asarray(index) + self.bank.class_start
            weight, momentum = (
                None if rows is None else
                mx.nd.array(round_rows(rows.asnumpy(), classes, rounding_key(self.bank.seed, num_update, stream)),
                            ctx=rows.context, dtype="float16")
                for stream, rows in ((WEIGHT_STREAM, weight), (MOMENTUM_STREAM, momentum)))
        self.bank.set(index, weight, momentum)
