"""A bank shard on disk: one rank's class centers and their momentum, and what they are.

Format 2 (written), these files (their names are checkpoint.layout's bank_shard_files):
    meta            JSON: version, num_classes, world_size, rank, class_start, num_local,
                    embedding_size, dtype, momentum_storage (absent before it existed: same),
                    checksums: each row file's size and xxh3_64, taken as it was written
                    (absent in shards saved before; checkpoint/checksums.py)
    weight          (num_local, D) rows in NumPy's .npy format (no size limit)
    momentum        the same for the momentum (momentum_storage same), or its int8 codes (int8);
                    no file when the bank has no momentum (none)
    momentum_scale  the int8 codes' float32 scales, (num_local, ceil(D / 64)) (int8 only)
(the row files of a shard: row_storage.Storage.arrays). Codes and scales are saved as stored, so
a restore, into the same split or any other, is bit for bit.
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

from ..config import write_json
from ..errors import MissingFileError, UsageError, mxnet_reason
from .checksums import SummedFile
from ..pfc.memory_bank import host_view
from ..pfc.row_storage import Storage

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
        rows = np.empty(self.shape, dtype=self.dtype)
        self.read_into(rows)
        return rows if dtype is None else rows.astype(dtype)

    def read_into(self, out):
        """Read the rows into `out` (a C-contiguous array of their shape and dtype), no copy between."""
        if out.shape != self.shape or out.dtype != self.dtype or not out.flags.c_contiguous:
            raise ValueError(f"cannot read {self.shape} {self.dtype} rows into {out.shape} {out.dtype}")
        with open(self.path, "rb", buffering=0) as handle:
            handle.seek(self.offset + self.start * self.shape[1] * self.dtype.itemsize)
            view, done = memoryview(out).cast("B"), 0
            while done < len(view):
                got = handle.readinto(view[done:])
                if not got:
                    raise ValueError(f"{os.path.basename(self.path)} ended before its rows {self.start}-{self.stop}")
                done += got


def write_shard(bank, files):
    """Write `bank` to `files` (format 2): each of its row arrays (bank.row_arrays()) to the
    file of its name, hashed as it is written, then "meta", which records those files' checksums
    ("checksums": {name: {"bytes", "xxh3_64"}}, checkpoint/checksums.py)."""
    checksums = {}
    for name, blocks in bank.row_arrays().items():
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(blocks[0].dtype)), "fortran_order": False,
                  "shape": (bank.num_local, blocks[0].shape[1])}
        with SummedFile(files[name]) as out:
            np.lib.format.write_array_header_1_0(out, header)
            for block in blocks:
                out.write(host_view(block) if block.context.device_type == "cpu" else block.asnumpy())
        checksums[name] = out.entry
    write_json(files["meta"], dict(bank.metadata(), version=FORMAT_VERSION, checksums=checksums))


def read_shard_arrays(files):
    """(meta, {name: rows}) of a saved shard, one entry per row array it stores
    (row_storage.Storage.arrays: weight, momentum, momentum_scale): format 2 as SavedRows (read
    only what is sliced and asked for), format 1 loaded. meta["momentum_storage"] is "same" for
    shards saved before it existed; meta leaves out the files' checksums. UsageError naming the
    file when it is missing or not a bank shard."""
    if os.path.isfile(files["meta"]):
        try:
            with open(files["meta"]) as handle:
                meta = json.load(handle)
            meta.setdefault("momentum_storage", "same")
            meta.pop("checksums", None)        # of the files, not the shard: the checkpoint checks them
            expected = Storage.from_meta(meta).arrays(meta.get("embedding_size"))
            arrays = {name: SavedRows(files[name]) for name in expected}
        except (OSError, ValueError, TypeError) as err:
            raise UsageError(f"cannot read bank shard {files['meta']}: {err}") from None
        found = {name: (rows.dtype, rows.shape) for name, rows in arrays.items()}
        wanted = {name: (kind, (meta.get("num_local"), columns)) for name, (kind, columns) in expected.items()}
        if meta.get("version") != FORMAT_VERSION or found != wanted:
            raise UsageError(f"{files['meta']}: not a format-{FORMAT_VERSION} bank shard of "
                             f"{(meta.get('num_local'), meta.get('embedding_size'))} rows "
                             f"({', '.join(f'{name} {shape} {kind}' for name, (kind, shape) in found.items())})")
        return meta, arrays
    if os.path.isfile(files["legacy"]):
        meta, weight, momentum = _read_legacy(files["legacy"])
        return meta, {"weight": weight, "momentum": momentum}
    raise MissingFileError(f"bank shard {files['meta']} not found")


def read_shard(files):
    """(meta, weight rows, momentum rows) of a saved shard (read_shard_arrays): the momentum as
    stored (int8 codes with momentum_storage int8; None with none)."""
    meta, arrays = read_shard_arrays(files)
    return meta, arrays["weight"], arrays.get("momentum")


def _read_legacy(path):
    try:
        saved = mx.nd.load(path)
    except (mx.base.MXNetError, UnicodeDecodeError) as error:
        reason = mxnet_reason(error) if isinstance(error, mx.base.MXNetError) else "MXNet's message is not UTF-8"
        raise UsageError(f"cannot read bank checkpoint {path}: {reason}") from None
    if not isinstance(saved, dict) or set(saved) != {"weight", "momentum", "meta"}:
        raise UsageError(f"{path} is not a sample_fc bank shard (keys weight, momentum, meta)")
    meta = dict(zip(LEGACY_FIELDS, (int(v) for v in saved["meta"].asnumpy())))
    if meta["version"] != 1:
        raise UsageError(f"{path}: bank format version {meta['version']}, expected 1")
    meta["dtype"] = np.dtype(saved["weight"].dtype).name
    meta["momentum_storage"] = "same"
    return meta, saved["weight"].asnumpy(), saved["momentum"].asnumpy()


def _check(bank, meta, where, keys):
    mine = bank.metadata()
    for key in keys:
        if meta.get(key) != mine[key]:
            raise UsageError(f"bank checkpoint {where} has {key}={meta.get(key)}, this bank expects "
                             f"{key}={mine[key]} (world size {bank.world_size}, rank {bank.rank})")


def _copy_rows(bank, first_row, sources, progress=None):
    """Bank rows [first_row, first_row + n) of each row array = the n given rows of the saved
    array of its name (`sources`: {name: rows}), CHUNK_ROWS at a time, each chunk read straight
    into the bank's host memory (a CPU bank: views taken once; a device bank: through a host
    copy). `progress(rows)` is told of each chunk's rows copied."""
    count, targets = len(sources["weight"]), bank.row_arrays()
    on_host = bank.ctx.device_type == "cpu"
    views = bank.host_rows().views if on_host else None      # host_view waits for MXNet: once, not per chunk
    for lo in range(0, count, CHUNK_ROWS):
        hi = min(lo + CHUNK_ROWS, count)
        start = first_row + lo
        for block, positions, rows in bank.block_slices(np.arange(start, first_row + hi)):
            span = slice(rows[0], rows[-1] + 1)
            for name in targets:
                saved = sources[name][lo + positions.start:lo + positions.stop]
                if not on_host:
                    target = targets[name][block]
                    target[span] = mx.nd.array(np.asarray(saved), ctx=target.context, dtype=target.dtype)
                elif isinstance(saved, SavedRows):
                    saved.read_into(views[name][block][span])
                else:                            # format 1: loaded whole
                    views[name][block][span] = np.asarray(saved)
        if progress is not None:
            progress(hi - lo)


def restore_shard(bank, files, progress=None):
    """Fill `bank` from its own saved shard: the same classes, split, embedding size, dtype and
    momentum storage. `progress(rows)` is told of the rows filled, chunk by chunk."""
    meta, arrays = read_shard_arrays(files)
    _check(bank, meta, files["meta"], ("num_classes", "class_start", "num_local", "embedding_size", "dtype",
                                       "momentum_storage"))
    _copy_rows(bank, 0, arrays, progress)


def restore_resharded(bank, all_files, progress=None):
    """Fill `bank` from the shards of a run with any world size (`all_files`, one per old
    rank): every class's center and momentum row lands in its new place. `progress(rows)` is
    told of the rows filled, chunk by chunk."""
    stop, covered = bank.class_start + bank.num_local, 0
    for files in all_files:
        meta, arrays = read_shard_arrays(files)
        _check(bank, meta, files["meta"], ("num_classes", "embedding_size", "dtype", "momentum_storage"))
        old_start = meta["class_start"]
        lo, hi = max(old_start, bank.class_start), min(old_start + meta["num_local"], stop)
        if lo >= hi:
            continue
        _copy_rows(bank, lo - bank.class_start, {name: rows[lo - old_start:hi - old_start]
                                                 for name, rows in arrays.items()}, progress)
        covered += hi - lo
    if covered != bank.num_local:
        raise UsageError(f"the saved shards cover {covered} of rank {bank.rank}'s {bank.num_local} classes "
                         f"[{bank.class_start}, {stop}); a shard is missing or overlaps")
