"""MemoryBank: one rank's shard of class centers and their momentum, on any context.

Rows are read and written by index (only the sampled rows of a step); the arrays live on
`ctx`, mx.cpu() or mx.gpu(i), with the same code for both. A shard is stored as row blocks,
each at most MAX_BLOCK_ELEMENTS numbers (the PyPI MXNet build holds fewer than 2^31 elements
in one NDArray), so a shard of any size works; a shard that fits one block is one NDArray
of weights and one of momentum, as it always was. Saving and loading: bank_shard.py.

How rows are stored is the bank's `storage` (row_storage.Storage: float32 or float16 weights;
momentum as the weights, int8 or none): the bank holds the arrays it names (Storage.arrays) and
hands the heads its rows through row_storage (host_rows for the host kernel, device_rows for the
device one).
"""
import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import numpy as np

from .row_storage import INITIAL_UPDATE, WEIGHT_STREAM, DeviceRows, HostRows, Storage, decoded
from .rounding import rounding_key
from .sampler import shard_range

MAX_BLOCK_ELEMENTS = 2 ** 31 - 1   # MXNet's tensor limit without USE_INT64_TENSOR_SIZE (tests lower it)
INIT_BLOCK = 4096          # classes per independently seeded block of the initial weights
INIT_STD = 0.01


def host_view(array):
    """A NumPy array sharing the memory of a CPU NDArray (no copy). The view holds a reference
    to the NDArray, so the memory outlives every view of it; the NDArray must not be written
    by pending MXNet operations while the view is used."""
    if array.context.device_type != "cpu":
        raise ValueError(f"host_view needs a CPU NDArray, got one on {array.context}")
    mx.nd.waitall()                 # no pending write may land after the view is read
    pointer = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    dtype = np.dtype(array.dtype)
    buffer = (ctypes.c_byte * (array.size * dtype.itemsize)).from_address(pointer.value)
    buffer.owner = array             # the view -> its buffer -> the NDArray: never freed under a view
    return np.frombuffer(buffer, dtype=dtype).reshape(array.shape)


def rows_per_block(embedding_size):
    """The most rows of `embedding_size` numbers one block holds."""
    return max(1, MAX_BLOCK_ELEMENTS // embedding_size)


def in_pieces(work, pieces, threads=1, progress=None):
    """work(piece) -> rows done, for every piece, `threads` at a time (NumPy's generators and the
    int8 kernel leave the GIL, so pieces of rows run in parallel); `progress(rows)` is told of
    each piece in order, on the calling thread (dist.Pace's collectives stay on it)."""
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    try:
        for rows in (pool.map(work, pieces) if pool else map(work, pieces)):
            if progress is not None:
                progress(rows)
    finally:
        if pool is not None:
            pool.shutdown()


def fill_initial_centers(dest, class_start, seed, progress=None, threads=1):
    """Fill dest (num_local x D, NDArray or NumPy) with N(0, INIT_STD) centers.

    Generated in fixed blocks of classes, each seeded by (seed, block), so a class's
    initial center does not depend on how the classes are split across ranks or row blocks
    (nor on `threads`); written block by block so no second full-size copy is ever held. A
    NumPy destination (a CPU bank's host view) gets whole blocks generated in place, `threads`
    blocks at a time. `progress(rows)` is told of each block's rows.
    """
    num_local, embedding_size = dest.shape
    stop = class_start + num_local
    in_place = isinstance(dest, np.ndarray) and dest.dtype == np.float32

    def fill(block):
        block_start = block * INIT_BLOCK
        rng = np.random.default_rng([seed, block])
        lo, hi = max(class_start, block_start), min(stop, block_start + INIT_BLOCK)
        if in_place and hi - lo == INIT_BLOCK:
            values = rng.standard_normal(out=dest[lo - class_start:hi - class_start], dtype=np.float32)
            values *= INIT_STD
        else:
            values = rng.standard_normal((INIT_BLOCK, embedding_size), dtype=np.float32) * INIT_STD
            dest[lo - class_start:hi - class_start] = values[lo - block_start:hi - block_start]
            if isinstance(dest, mx.nd.NDArray):
                dest.wait_to_read()      # bound the engine's queue of block copies (device banks)
        return hi - lo
    in_pieces(fill, range(class_start // INIT_BLOCK, (stop - 1) // INIT_BLOCK + 1), threads if in_place else 1,
              progress)
    return dest


class MemoryBank:
    """Class centers [class_start, class_start + num_local) and their momentum on `ctx`, in
    row blocks: block b holds local rows [starts[b], starts[b] + len(weights[b])) of `weights`,
    `momenta` (empty with momentum "none"; int8 codes with "int8") and `momentum_scales` (the
    int8 codes' float32 scales, else empty), as `storage` (row_storage.Storage) says.
    The centers start at fill_initial_centers' values, or at zero with `initial_centers` False
    (a bank a checkpoint fills next: drawing them is most of a large bank's start), `threads`
    blocks at a time in host memory; `progress(rows)` is told of the rows drawn, block by block
    (dist.Pace keeps ranks in step)."""

    def __init__(self, num_local, embedding_size, ctx, *, class_start=0, num_classes=None, rank=0,
                 world_size=1, seed=0, storage=Storage(), initial_centers=True, progress=None, threads=1):
        if num_local < 1:
            raise ValueError(f"num_local must be >= 1, got {num_local}")
        self.num_local, self.embedding_size = num_local, embedding_size
        self.class_start, self.ctx, self.storage = class_start, ctx, storage
        self.num_classes = num_classes if num_classes is not None else num_local
        self.rank, self.world_size, self.seed = rank, world_size, seed
        step = rows_per_block(embedding_size)
        self.starts = list(range(0, num_local, step))
        self.weights, self.weight_scales, self.momenta, self.momentum_scales = [], [], [], []
        if storage.weights == "int8" and ctx.device_type != "cpu":
            raise ValueError(f"a bank of {storage.describe()} lives in host memory (the host kernel's), not on {ctx}")
        blocks, drawn = self._blocks_by_name(), initial_centers and storage.weights != "int8"
        for start in self.starts:
            rows = min(step, num_local - start)
            for name, (kind, columns) in storage.arrays(embedding_size).items():
                # float weights are drawn in place below; the rest start at 0 (codes 0 of scale 0 too)
                empty = name == "weight" and drawn
                blocks[name].append((mx.nd.empty if empty else mx.nd.zeros)((rows, columns), ctx=ctx, dtype=kind))
            if drawn:
                weight = self.weights[-1]
                fill_initial_centers(host_view(weight) if ctx.device_type == "cpu" else weight,
                                     class_start + start, seed, progress, threads)
        if initial_centers and storage.weights == "int8":
            self._encode_initial_centers(progress, threads)

    @staticmethod
    def bytes_needed(num_local, embedding_size, storage=Storage()):
        """Bytes of a shard of `num_local` rows stored as `storage` (Storage.row_bytes)."""
        return num_local * storage.row_bytes(embedding_size)

    @classmethod
    def for_rank(cls, num_classes, rank, world_size, embedding_size, ctx, seed=0, storage=Storage(),
                 initial_centers=True, progress=None, threads=1):
        """The bank of `rank` in a balanced split of `num_classes` over `world_size` ranks."""
        class_start, num_local = shard_range(num_classes, rank, world_size)
        return cls(num_local, embedding_size, ctx, class_start=class_start, num_classes=num_classes,
                   rank=rank, world_size=world_size, seed=seed, storage=storage,
                   initial_centers=initial_centers, progress=progress, threads=threads)

    def _blocks_by_name(self):
        return {"weight": self.weights, "weight_scale": self.weight_scales, "momentum": self.momenta,
                "momentum_scale": self.momentum_scales}

    def _encode_initial_centers(self, progress, threads=1):
        """8-bit weights: the initial centers (fill_initial_centers' float32 values) written as the
        stored rows are, with update INITIAL_UPDATE's rounding noise, INIT_BLOCK rows at a time,
        `threads` pieces at once (each its own float32 buffer)."""
        rows, key = self.host_rows(), rounding_key(self.seed, INITIAL_UPDATE, WEIGHT_STREAM)
        buffers = threading.local()

        def encode(lo):
            hi = min(lo + INIT_BLOCK, self.num_local)
            if not hasattr(buffers, "values"):
                buffers.values = np.empty((min(INIT_BLOCK, self.num_local), self.embedding_size), dtype=np.float32)
            values = fill_initial_centers(buffers.values[:hi - lo], self.class_start + lo, self.seed)
            rows.put_weights(np.arange(lo, hi), values, key)
            return hi - lo
        in_pieces(encode, range(0, self.num_local, INIT_BLOCK), threads, progress)

    def row_arrays(self):
        """{name: row blocks} of every array this shard stores (Storage.arrays' names)."""
        blocks = self._blocks_by_name()
        return {name: blocks[name] for name in self.storage.arrays(self.embedding_size)}

    # ---- the whole shard (one block), and copies of any shard -----------------------------
    @property
    def weight(self):
        """The shard's weights as one NDArray (a shard of one block)."""
        return self._only(self.weights)

    @property
    def momentum(self):
        """The shard's momentum as one NDArray (a shard of one block, momentum stored as the weights)."""
        self._check_device_readable()
        if not self.momenta:
            raise ValueError("this shard stores no momentum (bank_momentum=none)")
        return self._only(self.momenta)

    def _check_device_readable(self):
        if not self.storage.device_readable:
            raise ValueError(f"this shard is stored as {self.storage.describe()}: only the host kernel reads "
                             f"it (to_numpy() gives it decoded)")

    def _only(self, blocks):
        if len(blocks) != 1:
            raise ValueError(f"this shard has {len(blocks)} row blocks; use the blocks or to_numpy()")
        return blocks[0]

    def to_numpy(self):
        """(weight, momentum) of the whole shard as NumPy copies (tests and tools). The momentum
        is the one the optimizer sees (row_storage.decoded: float32 zeros without momentum)."""
        arrays = {name: np.concatenate([block.asnumpy() for block in blocks])
                  for name, blocks in self.row_arrays().items()}
        return decoded(arrays, self.storage, arrays["weight"].shape)

    def host_rows(self):
        """The shard's rows for the host kernel (a CPU bank): row_storage.HostRows."""
        return HostRows(self, {name: [host_view(block) for block in blocks]
                               for name, blocks in self.row_arrays().items()})

    def device_rows(self):
        """The shard's rows for the device kernel: row_storage.DeviceRows."""
        return DeviceRows(self)

    # ---- rows by index ---------------------------------------------------------------------
    def block_slices(self, index):
        """[(block, positions lo:hi in index, rows local to the block)] for a sorted index."""
        bounds = np.searchsorted(index, self.starts[1:] + [self.num_local])
        found, lo = [], 0
        for block, hi in enumerate(bounds):
            if hi > lo:
                found.append((block, slice(lo, hi), np.asarray(index[lo:hi]) - self.starts[block]))
            lo = hi
        return found

    def index_array(self, index):
        return mx.nd.array(index, ctx=self.ctx, dtype="int64")

    def get(self, index):
        """(weight rows, momentum rows) for a sorted int64 index (NumPy), as copies; the momentum
        None in a bank without it (the device kernel's path: momentum stored as the weights or none)."""
        self._check_device_readable()
        index = np.asarray(index)
        arrays = [self.weights] + ([self.momenta] if self.momenta else [])
        if len(self.weights) == 1:
            where = self.index_array(index)
            rows = [mx.nd.take(blocks[0], where) for blocks in arrays]
        else:
            found = self.block_slices(index)
            rows = [mx.nd.concat(*[mx.nd.take(blocks[b], self.index_array(local)) for b, _, local in found], dim=0)
                    for blocks in arrays]
        return rows[0], (rows[1] if self.momenta else None)

    def set(self, index, weight, momentum):
        """Write rows `index` (sorted, NumPy) of weight and momentum (None in a bank without it);
        other rows are untouched (momentum stored as the weights or none)."""
        self._check_device_readable()
        for b, positions, rows in self.block_slices(np.asarray(index)):
            where = self.index_array(rows)
            self.weights[b][where] = weight[positions.start:positions.stop]
            if momentum is not None:
                self.momenta[b][where] = momentum[positions.start:positions.stop]

    def metadata(self):
        return {"num_classes": self.num_classes, "world_size": self.world_size, "rank": self.rank,
                "class_start": self.class_start, "num_local": self.num_local,
                "embedding_size": self.embedding_size, **self.storage.meta()}
