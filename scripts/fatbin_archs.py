#!/usr/bin/env python3
"""The GPU code a CUDA library carries: the architectures of the cubins and the PTX in its fat
binaries, read from the ELF section .nv_fatbin (no cuobjdump needed).

    python scripts/fatbin_archs.py .venv-gpu/lib/python3.11/site-packages/mxnet/libmxnet.so
    -> 197 fat binaries; cubin sm_50 sm_60 sm_70 sm_80 sm_86 in 197; no PTX

A fat binary is a header (magic 0xBA55ED50, version, header size, body size) followed by
entries, each a header (kind 1 = PTX, 2 = cubin; its header size; payload size; the
architecture as major*10+minor at byte 28) and its payload. A CUDA device runs a cubin of its own
major version and a minor not above its own (8.9 runs sm_86), or JIT-compiles PTX of an
architecture not above its own; with neither it runs nothing.
"""
import collections
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "cubin"}


def nv_fatbin_section(path):
    """The bytes of the ELF64 little-endian file's .nv_fatbin section (b'' when it has none)."""
    with open(path, "rb") as file:
        ident = file.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
        file.seek(shoff)
        table = file.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
        _, _, _, _, names_offset, names_size = sections[shstrndx]
        file.seek(names_offset)
        names = file.read(names_size)
        for name_index, _, _, _, offset, size in sections:
            if names[name_index:names.index(b"\0", name_index)] == b".nv_fatbin":
                file.seek(offset)
                return file.read(size)
    return b""


def fatbin_entries(section):
    """[[(kind, arch), ...] per fat binary] of a .nv_fatbin section; kind 'ptx' or 'cubin',
    arch as major*10+minor (86 for 8.6)."""
    binaries, position = [], 0
    while position + 16 <= len(section):
        magic, _, header_size, body_size = struct.unpack_from("<IHHQ", section, position)
        if magic != FATBIN_MAGIC:           # alignment padding between fat binaries
            position += 8
            continue
        entries, entry, end = [], position + header_size, position + header_size + body_size
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", section, entry)
            arch, = struct.unpack_from("<I", section, entry + 28)
            entries.append((KINDS.get(kind, f"kind{kind}"), arch))
            entry += entry_header + payload
        binaries.append(entries)
        position = end
    return binaries


def summary(binaries):
    """One line: how many fat binaries, and in how many each cubin/PTX architecture is."""
    counts = collections.Counter(item for entries in binaries for item in set(entries))
    parts = [f"{kind} sm_{arch} in {n}" for (kind, arch), n in sorted(counts.items())]
    ptx = "" if any(kind == "ptx" for kind, _ in counts) else "; no PTX"
    return f"{len(binaries)} fat binaries; " + ", ".join(parts) + ptx


def main(argv):
    if len(argv) != 2:
        print("usage: fatbin_archs.py LIBRARY.so", file=sys.stderr)
        return 2
    try:
        print(summary(fatbin_entries(nv_fatbin_section(argv[1]))))
    except (OSError, ValueError, struct.error) as error:
        print(f"fatbin_archs.py: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
