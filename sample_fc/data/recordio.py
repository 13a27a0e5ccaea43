"""The insightface RecordIO layout: reading (which keys are images, their integer labels,
`property`) and writing it (RecordWriter).

A dataset is `train.rec` + `train.idx` (lines "key<TAB>offset") + `property`
("num_classes,height,width") in the same folder. Record 0 is a header when its
`IRHeader.flag > 0`: its label is (start, end); image records are keys [1, start) and
identity records are keys [start, end), identity k at key start + k with label
(first_image_key, end_image_key). Without that header (record 0 absent or flag == 0) the
file is plain: every key in the .idx is an image.

Image labels are stored as float32 by RecordIO (a scalar, or an array whose first element
is the identity). They become np.int64 here; a label that is not a non-negative integer
below 2**24 (where float32 stops representing every integer) is an error naming its key.
"""
import os
import struct

import mxnet as mx
import numpy as np

from ..errors import MissingFileError, UsageError

FLOAT32_EXACT_LIMIT = 2 ** 24  # float32 represents every integer below this exactly
RECORD_MAGIC = 0xCED7230A      # dmlc RecordIO: each record starts with it and its length word
LENGTH_BITS = 29               # the length word: 3 bits of continuation flag, 29 of length


def read_property(folder):
    """Return (num_classes, height, width) from `folder`/property, or None if there is none."""
    path = os.path.join(folder, "property")
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise UsageError(f"{path}: expected 'num_classes,height,width' (three integers), got {len(raw)} "
                         f"bytes that are not text (damaged, or another file in its place)") from None
    fields = text.split(",")
    if len(fields) != 3 or not all(x.strip().isdigit() for x in fields):
        shown = repr(text) if len(text) <= 60 else f"{text[:60]!r}... ({len(raw)} bytes)"
        raise UsageError(f"{path}: expected 'num_classes,height,width' (three integers), got {shown}")
    return tuple(int(x) for x in fields)


def write_property(folder, num_classes, height, width):
    """Write `folder`/property as 'num_classes,height,width' (insightface layout)."""
    with open(os.path.join(folder, "property"), "w") as f:
        f.write(f"{num_classes},{height},{width}")


def label_to_int(header, key):
    """Return the identity of an image record as an int, checked integral and non-negative."""
    label = header.label
    value = float(label) if np.isscalar(label) else float(np.asarray(label).reshape(-1)[0])
    if not (np.isfinite(value) and value == int(value) and 0 <= value < FLOAT32_EXACT_LIMIT):
        raise UsageError(f"record key {key}: label {header.label!r} is not an integer identity "
                         f"in [0, 2**24) (float32 RecordIO labels are exact only below 2**24)")
    return int(value)


def check_index(path):
    """UsageError naming the line unless every line of the .idx at `path` is 'key<TAB>offset',
    two non-negative integers, each key once (what MXIndexedRecordIO reads, unchecked)."""
    with open(path, "rb") as f:
        raw = f.read()
    keys = set()
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        fields = line.strip().split(b"\t")
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            shown = line[:60].decode("latin-1")
            raise UsageError(f"index file {path} is not a RecordIO index: line {number} is {shown!r}, "
                             f"not 'key<TAB>offset' (damaged, or another file in its place)")
        key = int(fields[0])
        if key in keys:
            raise UsageError(f"index file {path} is not a RecordIO index: key {key} is listed twice "
                             f"(line {number})")
        keys.add(key)


class RecordFrames:
    """A .rec held open to check a record's framing (its magic, and a length that ends within the
    file) before MXNet reads the record: one handle and the file's size for every record read, not
    an open per record. A context manager; close() when done."""

    def __init__(self, rec_path):
        self.path = rec_path
        self._handle = open(rec_path, "rb")
        self.size = os.fstat(self._handle.fileno()).st_size

    def problem(self, offset):
        """Why no sound record starts at `offset` (one line), or None."""
        self._handle.seek(offset)
        frame = self._handle.read(8)
        magic, length_word = struct.unpack("<II", frame) if len(frame) == 8 else (None, 0)
        length = length_word & ((1 << LENGTH_BITS) - 1)
        if magic != RECORD_MAGIC or offset + 8 + length > self.size:
            return (f"no RecordIO record starts there, or its length {length} runs past the end of the "
                    f"{self.size}-byte file")
        return None

    def close(self):
        self._handle.close()

    def __enter__(self):
        return self

    def __exit__(self, *error):
        self.close()


def read_record(reader, frames, key):
    """(IRHeader, payload bytes) of record `key` of an open MXIndexedRecordIO whose .rec `frames`
    (RecordFrames) holds open. Its framing is checked first, so that a damaged record is a
    UsageError naming the key instead of MXNet reading or allocating what the bytes say."""
    offset = reader.idx[key]
    problem = frames.problem(offset)
    if problem:
        raise UsageError(f"record key {key} at offset {offset} is damaged ({problem})")
    try:
        record = reader.read_idx(key)
        header, payload = mx.recordio.unpack(record)
        if header.flag > 0 and len(np.atleast_1d(header.label)) != header.flag:
            raise ValueError(f"label of {header.flag} values cut short")
    except (mx.base.MXNetError, struct.error, ValueError, TypeError) as err:
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise UsageError(f"record key {key} at offset {offset} is damaged ({reason})") from None
    return header, payload


def open_record(path_imgrec, path_imgidx=None):
    """Open a .rec/.idx pair; return (reader, image_keys sorted np.int64, identity_range).

    identity_range is (start, end) from header record 0, or None for a plain file.
    """
    if path_imgrec.endswith(".idx"):
        raise UsageError(f"{path_imgrec} is the index; give the record file (.rec) next to it")
    if path_imgidx is None:
        path_imgidx = os.path.splitext(path_imgrec)[0] + ".idx"
    for path, what in ((path_imgrec, "record file (.rec)"), (path_imgidx, "index file (.idx)")):
        if not os.path.isfile(path):
            raise MissingFileError(f"{what} not found: {path}")
    check_index(path_imgidx)
    reader = mx.recordio.MXIndexedRecordIO(path_imgidx, path_imgrec, "r")
    keys = np.array(sorted(reader.keys), dtype=np.int64)
    if len(keys) == 0:
        raise UsageError(f"index file {path_imgidx} lists no records")
    last_offset, size = max(reader.idx.values()), os.path.getsize(path_imgrec)
    if last_offset >= size:
        raise UsageError(f"{path_imgidx} points to offset {last_offset} but {path_imgrec} has only "
                         f"{size} bytes: the .rec is truncated or the .idx belongs to another file")
    if keys[0] != 0:
        return reader, keys, None
    try:
        with RecordFrames(path_imgrec) as frames:
            header, _ = read_record(reader, frames, 0)
    except UsageError as err:
        raise UsageError(f"{path_imgrec}: {err}") from None
    if header.flag == 0:
        return reader, keys, None
    label = np.asarray(header.label).reshape(-1)
    start, end = (int(label[0]), int(label[1])) if label.size >= 2 else (-1, -1)
    if label.size < 2 or not 1 <= start <= end or start != label[0] or end != label[1]:
        raise UsageError(f"{path_imgrec}: header record 0 has label {header.label!r}; "
                         f"expected (start, end) with 1 <= start <= end")
    image_keys = np.arange(1, start, dtype=np.int64)
    missing = np.setdiff1d(np.arange(1, end, dtype=np.int64), keys, assume_unique=True)
    if missing.size:
        raise UsageError(f"{path_imgidx}: header record 0 says images are keys [1, {start}) and "
                         f"identities [{start}, {end}), but {missing.size} of those keys are "
                         f"missing from the index (first: {missing[0]})")
    return reader, image_keys, (start, end)


class RecordWriter:
    """Write identities in id order, then the identity records, header and `property`.

    The records go to `<prefix>.partial.rec/.idx` and take the final names in `finish`: a set
    already at `out_prefix` stays as it was until the new one is complete. Use as a context
    manager; if the block raises, the partial files are deleted and an existing set is untouched.
    """

    def __init__(self, out_prefix, image_size):
        self.folder = os.path.dirname(os.path.abspath(out_prefix))
        os.makedirs(self.folder, exist_ok=True)
        self.paths = (out_prefix + ".rec", out_prefix + ".idx")
        self.partial_paths = (out_prefix + ".partial.rec", out_prefix + ".partial.idx")
        self.image_size = image_size
        self._writer = mx.recordio.MXIndexedRecordIO(self.partial_paths[1], self.partial_paths[0], "w")
        self.ranges = []  # (first_image_key, end_image_key) per identity
        self._next_key = 1

    def add_identity(self, encoded_images):
        """Write the encoded images of the next identity (id = number of identities so far)."""
        label, first = len(self.ranges), self._next_key
        for encoded in encoded_images:
            header = mx.recordio.IRHeader(0, float(label), self._next_key, 0)
            self._writer.write_idx(self._next_key, mx.recordio.pack(header, encoded))
            self._next_key += 1
        self.ranges.append((first, self._next_key))
        return label

    def finish(self):
        """Write identity records, header record 0 and `property`; return (images, identities)."""
        start = self._next_key
        end = start + len(self.ranges)
        if end >= FLOAT32_EXACT_LIMIT:
            raise UsageError(f"{end} records exceed what float32 RecordIO labels address exactly (2**24)")
        for key, image_range in enumerate(self.ranges, start=start):
            self._writer.write_idx(key, mx.recordio.pack(mx.recordio.IRHeader(0, image_range, key, 0), b""))
        self._writer.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(0, (start, end), 0, 0), b""))
        self._writer.close()
        for partial, final in zip(self.partial_paths[::-1], self.paths[::-1]):    # the index first
            os.replace(partial, final)
        write_property(self.folder, len(self.ranges), self.image_size, self.image_size)
        return start - 1, len(self.ranges)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._writer.close()
            for path in self.partial_paths:
                if os.path.exists(path):
                    os.remove(path)
