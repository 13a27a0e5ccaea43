"""A bank shard on disk: one rank's class centers and their momentum, and what they are.

Format 2 (written), three files (their names are checkpoint.layout's bank_shard_files):
    meta      JSON: version, num_classes, world_size, rank, class_start, num_local,
              embedding_size, dtype
    weight    (num_local, D) rows in NumPy's .npy format (no size limit)
    momentum  the same for the momentum
Written block by block from the bank (a device block is copied to the host first); read
CHUNK_ROWS rows at a time with plain reads (SavedRows: neither loaded whole nor mapped, so
a restore never holds a second copy of a shard, not even as mapped pages in its RSS),
and any saved shard restores into any split of the same classes (a new world size, other
row blocks). Format 1 (runs saved before): one MXNet NDArray file with weight, momentum and
meta; still read.
"""
import json
import os

import mxnet as mx
import numpy as np

from .config import write_json
from .errors import MissingFileError, UsageError
from .memory_bank import host_view

FORMAT_VERSION = 2
CHUNK_ROWS = 65536          # rows copied per step of a restore
LEGACY_FIELDS = ("version", "num_classes", "world_size", "rank", "class_start", "num_local", "embedding_size")


class SavedRows:
    """Rows [start, stop) of a saved (num_local, D) .npy file, read only when asked for:
    slicing gives another SavedRows, np.asarray reads the rows."""

    def __init__(self, path, start=0, stop=None, header=None):
        self.path = path
        if header is None:
            with open(path, "rb") as handle:
                version = np.lib.format.read_magic(handle)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, fortran, dtype = read(handle)
                if fortran or len(shape) != 2:
                    raise ValueError(f"expected C-ordered rows, got shape {shape}")
                header = (tuple(shape), np.dtype(dtype), handle.tell())
        self.header = header
        self.shape_all, self.dtype, self.offset = header
        self.start, self.stop = start, self.shape_all[0] if stop is None else stop
        self.shape = (self.stop - self.start, self.shape_all[1])
        if os.path.getsize(path) < self.offset + self.shape_all[0] * self.shape_all[1] * self.dtype.itemsize:
            raise ValueError(f"{os.path.basename(path)} is shorter than its {self.shape_all} rows")

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, rows):
        lo, hi, step = rows.indices(len(self))
        if step != 1:
            raise ValueError("SavedRows are sliced contiguously")
        return SavedRows(self.path, self.start + lo, self.start + max(lo, hi), self.header)

    def __array__(self, dtype=None):
        width = self.shape[1]
        with open(self.path, "rb") as handle:
            handle.seek(self.offset + self.start * width * self.dtype.itemsize)
            rows = np.fromfile(handle, dtype=self.dtype, count=len(self) * width).reshape(self.shape)
        return rows if dtype is None else rows.astype(dtype)


def write_shard(bank, files):
    """Write `bank` to files {"meta", "weight", "momentum"} (format 2)."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(bank.dtype)), "fortran_order": False,
              "shape": (bank.num_local, bank.embedding_size)}
    for key, blocks in (("weight", bank.weights), ("momentum", bank.momenta)):
        with open(files[key], "wb") as handle:
            np.lib.format.write_array_header_1_0(handle, header)
            for block in blocks:
                (host_view(block) if block.context.device_type == "cpu" else block.asnumpy()).tofile(handle)
            handle.flush()
            os.fsync(handle.fileno())
    write_json(files["meta"], dict(bank.metadata(), version=FORMAT_VERSION))


def read_shard(files):
    """(meta, weight rows, momentum rows) of a saved shard: format 2 as SavedRows (read only
    what is sliced and asked for), format 1 loaded. UsageError naming the file when it is
    missing or not a bank shard."""
    if os.path.isfile(files["meta"]):
        try:
            with open(files["meta"]) as handle:
                meta = json.load(handle)
            weight, momentum = (SavedRows(files[key]) for key in ("weight", "momentum"))
        except (OSError, ValueError) as err:
            raise UsageError(f"cannot read bank shard {files['meta']}: {err}") from None
        shape = (meta.get("num_local"), meta.get("embedding_size"))
        if meta.get("version") != FORMAT_VERSION or weight.shape != shape or momentum.shape != shape:
            raise UsageError(f"{files['meta']}: not a format-{FORMAT_VERSION} bank shard of {shape} rows "
                             f"(weight {weight.shape}, momentum {momentum.shape})")
        return meta, weight, momentum
    if os.path.isfile(files["legacy"]):
        return _read_legacy(files["legacy"])
    raise MissingFileError(f"bank shard {files['meta']} not found")


def _read_legacy(path):
    try:
        saved = mx.nd.load(path)
    except mx.base.MXNetError as error:
        raise UsageError(f"cannot read bank checkpoint {path}: {error}") from None
    if not isinstance(saved, dict) or set(saved) != {"weight", "momentum", "meta"}:
        raise UsageError(f"{path} is not a sample_fc bank shard (keys weight, momentum, meta)")
    meta = dict(zip(LEGACY_FIELDS, (int(v) for v in saved["meta"].asnumpy())))
    if meta["version"] != 1:
        raise UsageError(f"{path}: bank format version {meta['version']}, expected 1")
    meta["dtype"] = np.dtype(saved["weight"].dtype).name
    return meta, saved["weight"].asnumpy(), saved["momentum"].asnumpy()


def _check(bank, meta, where, keys):
    mine = bank.metadata()
    for key in keys:
        if meta.get(key) != mine[key]:
            raise UsageError(f"bank checkpoint {where} has {key}={meta.get(key)}, this bank expects "
                             f"{key}={mine[key]} (world size {bank.world_size}, rank {bank.rank})")


def _copy_rows(bank, first_row, weight, momentum):
    """Bank rows [first_row, first_row + len(weight)) = the given rows, CHUNK_ROWS at a time."""
    for lo in range(0, len(weight), CHUNK_ROWS):
        hi = min(lo + CHUNK_ROWS, len(weight))
        start = first_row + lo
        for block, positions, rows in bank.block_slices(np.arange(start, first_row + hi)):
            span = slice(rows[0], rows[-1] + 1)
            for blocks, source in ((bank.weights, weight), (bank.momenta, momentum)):
                values = np.asarray(source[lo + positions.start:lo + positions.stop])
                target = blocks[block]
                if target.context.device_type == "cpu":
                    host_view(target)[span] = values
                else:
                    target[span] = mx.nd.array(values, ctx=target.context, dtype=target.dtype)


def restore_shard(bank, files):
    """Fill `bank` from its own saved shard: the same classes, split and embedding size."""
    meta, weight, momentum = read_shard(files)
    _check(bank, meta, files["meta"], ("num_classes", "class_start", "num_local", "embedding_size", "dtype"))
    _copy_rows(bank, 0, weight, momentum)


def restore_resharded(bank, all_files):
    """Fill `bank` from the shards of a run with any world size (`all_files`, one per old
    rank): every class's center and momentum row lands in its new place."""
    stop, covered = bank.class_start + bank.num_local, 0
    for files in all_files:
        meta, weight, momentum = read_shard(files)
        _check(bank, meta, files["meta"], ("num_classes", "embedding_size", "dtype"))
        old_start = meta["class_start"]
        lo, hi = max(old_start, bank.class_start), min(old_start + meta["num_local"], stop)
        if lo >= hi:
            continue
        _copy_rows(bank, lo - bank.class_start, weight[lo - old_start:hi - old_start],
                   momentum[lo - old_start:hi - old_start])
        covered += hi - lo
    if covered != bank.num_local:
        raise UsageError(f"the saved shards cover {covered} of rank {bank.rank}'s {bank.num_local} classes "
                         f"[{bank.class_start}, {stop}); a shard is missing or overlaps")
