"""What the checksums cost a checkpoint: writing one bank shard (bank_shard.write_shard, each row
file hashed with xxh3_64 as it is written) against the same bytes written the way it was
before checksums (header, rows with ndarray.tofile, fsync, the metadata JSON), alternately,
`--repeats` times each after one uncounted write, into a scratch folder removed at the end.

    python -m bench.checkpoint_write [--classes 1000000] [--embedding 512] [--folder /tmp]

The default shard, 1M classes x 512 float32 with its momentum, is 4.1 GB of rows: the folder's
file system needs that much free (checked first).
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import mxnet as mx
import numpy as np
import xxhash

from sample_fc.checkpoint.bank_shard import FORMAT_VERSION, write_shard
from sample_fc.checkpoint import bank_shard_files
from sample_fc.checkpoint.checksums import CHUNK_BYTES
from sample_fc.config import write_json
from sample_fc.pfc.memory_bank import MemoryBank, host_view


def write_shard_unsummed(bank, files):
    """bank_shard.write_shard as it was before checksums: the baseline."""
    for name, blocks in bank.row_arrays().items():
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(blocks[0].dtype)), "fortran_order": False,
                  "shape": (bank.num_local, blocks[0].shape[1])}
        with open(files[name], "wb") as handle:
            np.lib.format.write_array_header_1_0(handle, header)
            for block in blocks:
                host_view(block).tofile(handle)
            handle.flush()
            os.fsync(handle.fileno())
    write_json(files["meta"], dict(bank.metadata(), version=FORMAT_VERSION))


def filled_bank(classes, embedding):
    """A CPU float32 bank of `classes` rows, weights and momentum filled with random values."""
    bank = MemoryBank(classes, embedding, mx.cpu())
    rng = np.random.default_rng(0)
    for blocks in bank.row_arrays().values():
        for block in blocks:
            view = host_view(block)
            for start in range(0, len(view), 65536):
                view[start:start + 65536] = rng.standard_normal((len(view[start:start + 65536]), embedding),
                                                                dtype=np.float32)
    return bank


def hashing_seconds(bank):
    """Seconds to xxh3_64 every row of `bank` in memory, as SummedFile does while writing: the
    work the checksums add, without the disk's noise."""
    start = time.perf_counter()
    for blocks in bank.row_arrays().values():
        digest = xxhash.xxh3_64()
        for block in blocks:
            view = memoryview(host_view(block)).cast("B")
            for offset in range(0, len(view), CHUNK_BYTES):
                digest.update(view[offset:offset + CHUNK_BYTES])
    return time.perf_counter() - start


def timed_write(writer, bank, folder):
    """Seconds `writer` takes to write `bank` into a fresh `folder` (removed afterwards)."""
    os.makedirs(folder)
    files = bank_shard_files(folder, 0)
    start = time.perf_counter()
    writer(bank, files)
    seconds = time.perf_counter() - start
    shutil.rmtree(folder)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_write", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--embedding", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", default=tempfile.gettempdir(), help="where the scratch folder goes")
    args = parser.parse_args(argv)
    needed = 2 * 4 * args.classes * args.embedding
    free = shutil.disk_usage(args.folder).free
    if free < 1.2 * needed:
        parser.error(f"--folder {args.folder}: {free / 1e9:.1f} GB free, a shard needs {needed / 1e9:.1f} GB; "
                     f"choose another folder or fewer --classes")
    bank = filled_bank(args.classes, args.embedding)
    scratch = tempfile.mkdtemp(prefix="checkpoint_write.", dir=args.folder)
    times = {"without checksums": [], "with checksums": []}
    try:
        timed_write(write_shard_unsummed, bank, os.path.join(scratch, "warm-up"))   # first write: not counted
        for repeat in range(args.repeats):          # alternately, so the disk's state favours neither
            times["without checksums"].append(timed_write(write_shard_unsummed, bank,
                                                          os.path.join(scratch, f"plain{repeat}")))
            times["with checksums"].append(timed_write(write_shard, bank, os.path.join(scratch, f"summed{repeat}")))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"write_shard of {args.classes:,} classes x {args.embedding} float32, weights and momentum "
          f"({needed / 1e9:.2f} GB), {args.repeats} times each:")
    for name, seconds in times.items():
        print(f"  {name:18s} {' '.join(f'{s:6.2f}' for s in seconds)} s   median {np.median(seconds):6.2f} s   "
              f"{needed / np.median(seconds) / 1e9:.2f} GB/s")
    hashing = min(hashing_seconds(bank) for _ in range(args.repeats))
    print(f"  hashing alone      {hashing:6.2f} s ({needed / hashing / 1e9:.1f} GB/s): the work the checksums add")
    with_sums, without = times["with checksums"], times["without checksums"]
    print(f"  ratio with/without: {np.median(with_sums) / np.median(without):.3f} (medians), "
          f"{min(with_sums) / min(without):.3f} (fastest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
