"""MemoryBank: one rank's shard of class centers and their momentum, on any context.

Rows are read and written by index (only the sampled rows of a step); the arrays live on
`ctx`, mx.cpu() or mx.gpu(i), with the same code for both.
"""
import ctypes

import mxnet as mx
import numpy as np

from .errors import UsageError
from .sampler import shard_range

INIT_BLOCK = 4096          # classes per independently seeded block of the initial weights
INIT_STD = 0.01
FORMAT_VERSION = 1
META_FIELDS = ("version", "num_classes", "world_size", "rank", "class_start", "num_local",
               "embedding_size")


def host_view(array):
    """A NumPy array sharing the memory of a CPU NDArray (no copy). The NDArray must stay
    alive and must not be written by pending MXNet operations while the view is used."""
    if array.context.device_type != "cpu":
        raise ValueError(f"host_view needs a CPU NDArray, got one on {array.context}")
    mx.nd.waitall()                 # no pending write may land after the view is read
    pointer = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    dtype = np.dtype(array.dtype)
    buffer = (ctypes.c_byte * (array.size * dtype.itemsize)).from_address(pointer.value)
    return np.frombuffer(buffer, dtype=dtype).reshape(array.shape)


def fill_initial_centers(dest, class_start, seed):
    """Fill dest (num_local x D, NDArray or NumPy) with N(0, INIT_STD) centers.

    Generated in fixed blocks of classes, each seeded by (seed, block), so a class's
    initial center does not depend on how the classes are split across ranks; written
    block by block so no second full-size copy is ever held. A NumPy destination (a CPU
    bank's host view) gets whole blocks generated in place.
    """
    num_local, embedding_size = dest.shape
    stop = class_start + num_local
    in_place = isinstance(dest, np.ndarray) and dest.dtype == np.float32
    for block in range(class_start // INIT_BLOCK, (stop - 1) // INIT_BLOCK + 1):
        block_start = block * INIT_BLOCK
        rng = np.random.default_rng([seed, block])
        lo, hi = max(class_start, block_start), min(stop, block_start + INIT_BLOCK)
        if in_place and hi - lo == INIT_BLOCK:
            values = rng.standard_normal(out=dest[lo - class_start:hi - class_start], dtype=np.float32)
            values *= INIT_STD
            continue
        values = rng.standard_normal((INIT_BLOCK, embedding_size), dtype=np.float32) * INIT_STD
        dest[lo - class_start:hi - class_start] = values[lo - block_start:hi - block_start]
        if isinstance(dest, mx.nd.NDArray):
            dest.wait_to_read()      # bound the engine's queue of block copies (device banks)
    return dest


class MemoryBank:
    """Class centers [class_start, class_start + num_local) and their momentum on `ctx`."""

    def __init__(self, num_local, embedding_size, ctx, *, class_start=0, num_classes=None, rank=0,
                 world_size=1, seed=0, dtype="float32"):
        if num_local < 1:
            raise ValueError(f"num_local must be >= 1, got {num_local}")
        self.num_local, self.embedding_size = num_local, embedding_size
        self.class_start, self.ctx, self.dtype = class_start, ctx, dtype
        self.num_classes = num_classes if num_classes is not None else num_local
        self.rank, self.world_size = rank, world_size
        self.weight = mx.nd.empty((num_local, embedding_size), ctx=ctx, dtype=dtype)
        fill_initial_centers(host_view(self.weight) if ctx.device_type == "cpu" else self.weight,
                             class_start, seed)
        self.momentum = mx.nd.zeros((num_local, embedding_size), ctx=ctx, dtype=dtype)

    @classmethod
    def for_rank(cls, num_classes, rank, world_size, embedding_size, ctx, seed=0):
        """The bank of `rank` in a balanced split of `num_classes` over `world_size` ranks."""
        class_start, num_local = shard_range(num_classes, rank, world_size)
        return cls(num_local, embedding_size, ctx, class_start=class_start, num_classes=num_classes,
                   rank=rank, world_size=world_size, seed=seed)

    def index_array(self, index):
        return mx.nd.array(index, ctx=self.ctx, dtype="int64")

    def get(self, index):
        """(weight rows, momentum rows) for an int64 index (NumPy or NDArray), as copies."""
        index = index if isinstance(index, mx.nd.NDArray) else self.index_array(index)
        return mx.nd.take(self.weight, index), mx.nd.take(self.momentum, index)

    def set(self, index, weight, momentum):
        """Write rows `index` of weight and momentum; other rows are untouched."""
        index = index if isinstance(index, mx.nd.NDArray) else self.index_array(index)
        self.weight[index] = weight
        self.momentum[index] = momentum

    # ---- persistence -----------------------------------------------------------------
    def metadata(self):
        return {"version": FORMAT_VERSION, "num_classes": self.num_classes,
                "world_size": self.world_size, "rank": self.rank, "class_start": self.class_start,
                "num_local": self.num_local, "embedding_size": self.embedding_size}

    def save(self, path):
        """Write weight, momentum and metadata to one file (MXNet NDArray format)."""
        meta = mx.nd.array([self.metadata()[k] for k in META_FIELDS], dtype="int64")
        mx.nd.save(path, {"weight": self.weight, "momentum": self.momentum, "meta": meta})

    def load(self, path):
        """Restore weight and momentum from `path`; its shard must be exactly this bank's."""
        saved_meta, weight, momentum = read_shard(path)
        mine = self.metadata()
        for key in ("num_classes", "class_start", "num_local", "embedding_size"):
            if saved_meta[key] != mine[key]:
                raise UsageError(f"bank checkpoint {path} has {key}={saved_meta[key]}, this bank "
                                 f"expects {key}={mine[key]} (world size {self.world_size}, "
                                 f"rank {self.rank}); a different world size needs resharding")
        self.weight[:] = weight.as_in_context(self.ctx)
        self.momentum[:] = momentum.as_in_context(self.ctx)

    def load_resharded(self, paths):
        """Fill this bank from the shards of a run with any world size (`paths`, one per
        old rank): every class's center and momentum row lands in its new place."""
        stop = self.class_start + self.num_local
        covered = 0
        for path in paths:
            meta, weight, momentum = read_shard(path)
            if (meta["num_classes"], meta["embedding_size"]) != (self.num_classes, self.embedding_size):
                raise UsageError(f"bank checkpoint {path} has num_classes={meta['num_classes']}, "
                                 f"embedding_size={meta['embedding_size']}; this run expects "
                                 f"num_classes={self.num_classes}, embedding_size={self.embedding_size}")
            old_start, old_stop = meta["class_start"], meta["class_start"] + meta["num_local"]
            lo, hi = max(old_start, self.class_start), min(old_stop, stop)
            if lo >= hi:
                continue
            rows = slice(lo - self.class_start, hi - self.class_start)
            self.weight[rows] = weight[lo - old_start:hi - old_start].as_in_context(self.ctx)
            self.momentum[rows] = momentum[lo - old_start:hi - old_start].as_in_context(self.ctx)
            covered += hi - lo
        if covered != self.num_local:
            raise UsageError(f"the shards {paths} cover {covered} of this rank's {self.num_local} "
                             f"classes [{self.class_start}, {stop}); a shard is missing or overlaps")


def read_shard(path):
    """(metadata dict, weight, momentum) of a saved bank shard, on the CPU."""
    try:
        saved = mx.nd.load(path)
    except mx.base.MXNetError as error:
        raise UsageError(f"cannot read bank checkpoint {path}: {error}") from None
    if not isinstance(saved, dict) or set(saved) != {"weight", "momentum", "meta"}:
        raise UsageError(f"{path} is not a sample_fc bank shard (keys weight, momentum, meta)")
    meta = dict(zip(META_FIELDS, (int(v) for v in saved["meta"].asnumpy())))
    if meta["version"] != FORMAT_VERSION:
        raise UsageError(f"{path}: bank format version {meta['version']}, expected {FORMAT_VERSION}")
    return meta, saved["weight"], saved["momentum"]
