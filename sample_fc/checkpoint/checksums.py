"""Checksums of a checkpoint's files: each file's size and its xxh3_64 hash, taken from the bytes
as they are written, recorded in COMPLETE and compared on every read of the checkpoint
(layout.verify_files).

xxh3_64 (the xxhash package): several times faster than zlib.crc32 or crc32c, so a bank shard's
sum costs little next to writing it (docs/benchmarks-history.md). It detects damage (a flipped
byte, a torn write); it is no defence against someone who changes a file on purpose.

An entry is {"bytes": n, "xxh3_64": "<16 hex digits>"}. This module imports only the light
sample_fc.config (its JSON text) of sample_fc.
"""
import os

import xxhash

from ..config import json_text

ALGORITHM = "xxh3_64"
CHUNK_BYTES = 16 << 20          # hashed, then written (or read back), this much at a time


def entry_of(size, digest):
    return {"bytes": size, ALGORITHM: digest}


class SummedFile:
    """A new binary file whose bytes are counted and hashed as they are written: use it as a
    context manager, write bytes or contiguous NumPy arrays, then read `entry`. The file is
    flushed and fsynced when the block ends without an error."""

    def __init__(self, path):
        self.path = path
        self._hash = xxhash.xxh3_64()
        self._size = 0
        self._handle = open(path, "wb")

    def write(self, data):
        """Write `data` (bytes, or a C-contiguous array: written as its memory is laid out)."""
        view = memoryview(data).cast("B")
        for start in range(0, len(view), CHUNK_BYTES):
            chunk = view[start:start + CHUNK_BYTES]
            self._hash.update(chunk)
            self._handle.write(chunk)
        self._size += len(view)
        return len(view)

    @property
    def entry(self):
        """The file's {"bytes", "xxh3_64"} entry for what was written so far."""
        return entry_of(self._size, self._hash.hexdigest())

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        try:
            if kind is None:
                self._handle.flush()
                os.fsync(self._handle.fileno())
        finally:
            self._handle.close()


def write_bytes(path, data):
    """Write `data` to the new file `path` (fsynced); its entry."""
    with SummedFile(path) as out:
        out.write(data)
    return out.entry


def write_json(path, payload):
    """Write `payload` as JSON (config.json_text, as config.write_json) to the new file `path`
    inside a checkpoint being written (no temporary file: the directory itself is renamed when
    complete); its entry, from the bytes written."""
    return write_bytes(path, json_text(payload).encode("utf-8"))


def sum_of_file(path):
    """The entry of the file at `path`, read back. For files that MXNet writes itself
    (mx.nd.save, mx.model.save_checkpoint: no way to see their bytes as they go), right after it
    wrote them, while they are still in the page cache; and for checking a file."""
    digest, size = xxhash.xxh3_64(), 0
    buffer = bytearray(CHUNK_BYTES)
    with open(path, "rb") as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(memoryview(buffer)[:count])
            size += count
    return entry_of(size, digest.hexdigest())


def first_difference(folder, recorded):
    """(file name, what is wrong) of the first file of `recorded` ({name: entry} of files in
    `folder`) that is missing, has another size, or fails its checksum; None when all match.
    Every size is compared before any file is hashed (a truncated file is found at once)."""
    names = sorted(recorded)
    for name in names:
        path, want = os.path.join(folder, name), recorded[name].get("bytes")
        if os.path.basename(name) != name or not os.path.isfile(path):
            return name, "is missing"
        size = os.path.getsize(path)
        if size != want:
            return name, (f"is truncated ({size} bytes, {want} when written)" if isinstance(want, int) and size < want
                          else f"has {size} bytes, {want} when written")
    for name in names:
        if sum_of_file(os.path.join(folder, name))[ALGORITHM] != recorded[name].get(ALGORITHM):
            return name, f"fails its {ALGORITHM} checksum (its bytes changed after it was written)"
    return None
