"""Seeded damage to a file's bytes: what disks, downloads and people do to files.

Each damage is a function (rng, data, other) -> new bytes, `other` the bytes of a sound file
of another format (for `swap`). The generator is the caller's np.random.Generator, so a case
is reproduced from its seed alone.
"""
import numpy as np


def flip(rng, data, other):
    """1-8 bytes at random offsets replaced by random bytes (each differs from the original)."""
    if not data:
        return bytes(rng.integers(0, 256, 1, dtype=np.uint8))
    damaged = bytearray(data)
    for offset in rng.integers(0, len(data), int(rng.integers(1, 9))):
        damaged[offset] ^= int(rng.integers(1, 256))
    return bytes(damaged)


def flip_header(rng, data, other):
    """As flip, within the first 64 bytes, where formats keep their sizes and counts."""
    if not data:
        return flip(rng, data, other)
    damaged = bytearray(data)
    for offset in rng.integers(0, min(len(data), 64), int(rng.integers(1, 4))):
        damaged[offset] ^= int(rng.integers(1, 256))
    return bytes(damaged)


def truncate(rng, data, other):
    """The first k bytes, 0 < k < size (a copy or download cut short)."""
    return data[:int(rng.integers(1, len(data)))] if len(data) > 1 else b""


def empty(rng, data, other):
    """Zero bytes (a file created and never written)."""
    return b""


def append(rng, data, other):
    """1..4096 random bytes after the end (a wrong size)."""
    return data + bytes(rng.integers(0, 256, int(rng.integers(1, 4097)), dtype=np.uint8))


def swap(rng, data, other):
    """Another format's sound file in this one's place."""
    return other


DAMAGES = {"flip": flip, "flip_header": flip_header, "truncate": truncate, "empty": empty, "append": append,
           "swap": swap}


def damage(name, rng, data, other):
    """The bytes of `data` damaged by DAMAGES[name]; always different from `data`."""
    damaged = DAMAGES[name](rng, data, other)
    return damaged if damaged != data else data + b"\0"
