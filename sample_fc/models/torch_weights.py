"""PyTorch state dicts (`torch.save(model.state_dict(), path)`: insightface arcface_torch's
backbone.pth) read as NumPy arrays, without torch and without running anything in the file.

The format torch >= 1.6 writes is a zip archive: `<name>/data.pkl`, a pickle of the state
dict in which each tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, hooks)` and each storage a persistent id ('storage', torch.<Type>Storage, key,
location, numel) whose bytes are the member `<name>/data/<key>` (byte order in
`<name>/byteorder`, little when absent). The legacy format of older torch (a bare pickle
stream) is not read.

A plain pickle.load (torch.load without weights_only) calls whatever the file names.
read_state_dict admits only the globals a state dict needs, ADMITTED below, each replaced by
a NumPy stand-in, and refuses any other by name before anything is called; a storage is
checked against its bytes and a tensor's view against its storage before NumPy reads it.
Every problem with a file is a UsageError naming it.
"""
import collections
import os
import pickle
import zipfile
from typing import NamedTuple

import numpy as np

from ..errors import MissingFileError, UsageError

# the first bytes of torch's legacy format: pickle protocol 2, then its magic number as a long
LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
REASON_CHARS = 300        # of an error's text quoted in the one-line message
# torch.<Type>Storage -> the NumPy dtype of its elements (bfloat16 is widened to float32)
STORAGE_DTYPES = {"FloatStorage": "f4", "DoubleStorage": "f8", "HalfStorage": "f2", "BFloat16Storage": "u2",
                  "LongStorage": "i8", "IntStorage": "i4", "ShortStorage": "i2", "CharStorage": "i1",
                  "ByteStorage": "u1", "BoolStorage": "?"}


class StorageType(NamedTuple):
    """What find_class gives for torch.<Type>Storage: its element type (immutable: the file's
    BUILD opcodes cannot change what later files read)."""
    name: str
    dtype: np.dtype


def _ints(values, what):
    if not (isinstance(values, tuple) and all(type(v) is int and v >= 0 for v in values)):
        raise pickle.UnpicklingError(f"{what} {values!r} is not a tuple of non-negative ints")
    return values


def _rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    """torch._utils._rebuild_tensor_v2 in NumPy: the view (offset, size, stride) of the 1-D
    storage array, copied contiguous; a view reaching outside its storage is refused."""
    if not isinstance(storage, np.ndarray) or type(offset) is not int or offset < 0:
        raise pickle.UnpicklingError("a tensor without a storage read from the archive")
    size, stride = _ints(size, "tensor size"), _ints(stride, "tensor stride")
    if len(size) != len(stride):
        raise pickle.UnpicklingError(f"tensor size {size} and stride {stride} differ in length")
    if 0 in size:
        return np.empty(size, storage.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size:
        raise pickle.UnpicklingError(f"a tensor of size {size}, stride {stride} at offset {offset} reaches "
                                     f"element {last} of a storage of {storage.size}")
    if np.prod(size, dtype=object) > storage.size:     # repeated elements: never in a state dict
        raise pickle.UnpicklingError(f"a tensor of size {size} holds more elements than its storage ({storage.size})")
    view = np.lib.stride_tricks.as_strided(storage[offset:], size, [s * storage.itemsize for s in stride],
                                           writeable=False)
    return view.copy()          # C-contiguous, owning its data


def _rebuild_parameter(data, requires_grad=False, hooks=None):
    """torch._utils._rebuild_parameter: an nn.Parameter is its data here."""
    return data


ADMITTED = {
    ("collections", "OrderedDict"): collections.OrderedDict,     # the state dict, and a tensor's empty hooks
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,  # state_dict(keep_vars=True)
}
ADMITTED.update({("torch", name): StorageType(name, np.dtype(code)) for name, code in STORAGE_DTYPES.items()})


class _Refused(pickle.UnpicklingError):
    pass


class _StateDictUnpickler(pickle.Unpickler):
    """Resolves only ADMITTED globals; storages come from the archive as NumPy arrays."""

    def __init__(self, data, archive, prefix, byteorder):
        super().__init__(data)
        self.archive, self.prefix, self.byteorder, self.storages = archive, prefix, byteorder, {}

    def find_class(self, module, name):
        if (module, name) not in ADMITTED:
            raise _Refused(f"{module}.{name}")
        return ADMITTED[module, name]

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and
                isinstance(pid[1], StorageType) and isinstance(pid[2], str) and type(pid[4]) is int):
            raise pickle.UnpicklingError(f"persistent id {pid!r} is not a storage")
        _, kind, key, _, numel = pid
        if key not in self.storages:
            member = f"{self.prefix}/data/{key}"
            try:
                raw = self.archive.read(member)
            except KeyError:
                raise pickle.UnpicklingError(f"storage {key} has no member {member}") from None
            if len(raw) != numel * kind.dtype.itemsize:
                raise pickle.UnpicklingError(f"storage {key} ({kind.name}) holds {len(raw)} bytes, "
                                             f"not {numel} elements")
            array = np.frombuffer(raw, kind.dtype.newbyteorder(self.byteorder))
            if kind.name == "BFloat16Storage":     # the high half of a float32
                array = (array.astype(np.uint32) << 16).view(np.float32)
            self.storages[key] = array.astype(array.dtype.newbyteorder("="), copy=False)
        return self.storages[key]


def _data_prefix(path, archive):
    """The archive's folder that holds data.pkl (torch names it after the file, or 'archive')."""
    found = [name[:-len("/data.pkl")] for name in archive.namelist()
             if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(found) != 1:
        raise UsageError(f"{path}: a zip archive but not a PyTorch file: {len(found)} <name>/data.pkl members")
    return found[0]


def read_state_dict(path):
    """{name: np.ndarray} of the state dict saved in `path` (see the module docstring).
    MissingFileError if there is no such file; UsageError naming the file if it is torch's
    legacy format, not a PyTorch zip archive, calls a global outside ADMITTED (refused, not
    run), is damaged, or holds anything but a mapping of names to tensors."""
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such file")
    with open(path, "rb") as handle:
        head = handle.read(len(LEGACY_MAGIC))
    if head == LEGACY_MAGIC:
        raise UsageError(f"{path}: a PyTorch file in the legacy format (torch < 1.6), which is not supported; "
                         f"re-save it as a zip archive: torch.save(torch.load(path, weights_only=True), new_path)")
    if not zipfile.is_zipfile(path):
        raise UsageError(f"{path}: not a PyTorch file (torch.save writes a zip archive; this is none)")
    try:
        with zipfile.ZipFile(path) as archive:
            prefix = _data_prefix(path, archive)
            has_byteorder = f"{prefix}/byteorder" in archive.namelist()
            byteorder = archive.read(f"{prefix}/byteorder").decode().strip() if has_byteorder else "little"
            if byteorder not in ("little", "big"):
                raise pickle.UnpicklingError(f"byteorder {byteorder!r}")
            with archive.open(f"{prefix}/data.pkl") as data:
                content = _StateDictUnpickler(data, archive, prefix, "<" if byteorder == "little" else ">").load()
    except _Refused as err:
        raise UsageError(f"{path}: not a state dict: refused to call {err}, which a state dict never needs "
                         f"(nothing in the file was run; torch.save(model) pickles the model's code, "
                         f"save model.state_dict())") from None
    except UsageError:
        raise
    except Exception as err:   # with only ADMITTED callables, any failure means a damaged file
        reason = " ".join(f"{type(err).__name__}: {err}".split())   # one line; zipfile's may quote
        reason = reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + " ..."   # KBs of the file
        raise UsageError(f"{path}: not a readable PyTorch state dict ({reason})") from None
    if not isinstance(content, dict):
        raise UsageError(f"{path}: holds a {type(content).__name__}, not a state dict")
    bad = [key for key, value in content.items() if not (isinstance(key, str) and isinstance(value, np.ndarray))]
    if bad:
        raise UsageError(f"{path}: not a state dict of tensors: entry {bad[0]!r} is "
                         f"{type(content[bad[0]]).__name__}")
    return dict(content)
