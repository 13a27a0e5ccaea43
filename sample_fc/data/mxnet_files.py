"""MXNet's two files of a saved model, checked before MXNet reads them: the symbol JSON
(`-symbol.json`) and the NDArray file format (`.params`, what mx.nd.save writes).

mx.sym.load of a file that is not the graph JSON fails with MXNet's parser's message, which
for binary bytes is not UTF-8 (and MXNet's Python side then fails to decode it);
symbol_file_problem reads the JSON and checks the graph's structure first (every node an op
and a name, every input and head an earlier node).

mx.nd.load trusts the sizes in the file: a damaged count or shape makes its C++ loader
allocate without bound, read past the end, or fail with a message that is not UTF-8 (which
MXNet's Python side then cannot decode). check_ndarray_file walks the layout first, without
reading the data, and raises UsageError naming the file and the first inconsistency:

    uint64 0x112 (list magic), uint64 0 (reserved), uint64 N (arrays), then N arrays:
        uint32 magic 0xF993FAC9 (V2) or 0xF993FACA (V3), int32 storage type (0: dense),
        uint32 ndim, int64 dims[ndim], then unless ndim == 0: int32 device type, int32
        device id, int32 dtype flag, and prod(dims) * itemsize bytes of data;
    uint64 K (names: 0 or N), then K times uint64 length + that many UTF-8 bytes;
    and nothing after.
"""
import json
import struct

from ..errors import UsageError

LIST_MAGIC = 0x112
ARRAY_MAGICS = (0xF993FAC9, 0xF993FACA)
MAX_NDIM = 32
# mshadow's type flags -> bytes per element
ITEM_SIZES = {0: 4, 1: 8, 2: 2, 3: 1, 4: 4, 5: 1, 6: 8, 7: 1, 8: 2, 9: 2, 10: 4, 11: 8, 12: 2}


class _Damaged(Exception):
    pass


class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt, what):
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise _Damaged(f"ends inside {what} at byte {self.at}")
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return values if len(values) > 1 else values[0]

    def skip(self, count, what):
        if count > len(self.data) - self.at:
            raise _Damaged(f"ends inside {what}: it needs {count} bytes at byte {self.at}, "
                           f"{len(self.data) - self.at} are left")
        self.at += count


def _check_array(reader, index):
    what = f"array {index}"
    magic = reader.take("<I", what)
    if magic not in ARRAY_MAGICS:
        raise _Damaged(f"{what} starts with 0x{magic:08X}, not an NDArray's magic")
    storage = reader.take("<i", what)
    if storage != 0:
        raise _Damaged(f"{what} has storage type {storage}, not a dense array's (0)")
    ndim = reader.take("<I", what)
    if magic == ARRAY_MAGICS[1] and ndim == 0xFFFFFFFF:       # V3: an array of unknown shape
        return
    if ndim > MAX_NDIM:
        raise _Damaged(f"{what} has {ndim} dimensions")
    dims = reader.take(f"<{ndim}q", what) if ndim else ()
    dims = dims if isinstance(dims, tuple) else (dims,)
    if any(d < 0 for d in dims):
        raise _Damaged(f"{what} has shape {dims}")
    if ndim == 0:
        return
    _, _, dtype = reader.take("<iii", what)
    if dtype not in ITEM_SIZES:
        raise _Damaged(f"{what} has dtype flag {dtype}, which MXNet does not have")
    count = 1
    for d in dims:
        count *= d
    reader.skip(count * ITEM_SIZES[dtype], f"{what} of shape {dims}")


def _check(data):
    reader = _Reader(data)
    if len(data) < 24 or reader.take("<Q", "the header") != LIST_MAGIC or reader.take("<Q", "the header") != 0:
        raise _Damaged("does not start as an NDArray file (list magic 0x112)")
    arrays = reader.take("<Q", "the array count")
    if arrays > (len(data) - reader.at) // 16:               # each array takes 16 bytes at least
        raise _Damaged(f"says it holds {arrays} arrays, more than its {len(data)} bytes can")
    for index in range(arrays):
        _check_array(reader, index)
    names = reader.take("<Q", "the name count")
    if names not in (0, arrays):
        raise _Damaged(f"has {names} names for {arrays} arrays")
    for index in range(names):
        length = reader.take("<Q", f"name {index}")
        start = reader.at
        reader.skip(length, f"name {index}")
        try:
            data[start:reader.at].decode("utf-8")
        except UnicodeDecodeError:
            raise _Damaged(f"name {index} is not UTF-8") from None
    if reader.at != len(data):
        raise _Damaged(f"has {len(data) - reader.at} bytes after its last name (at byte {reader.at})")


def ndarray_file_problem(path):
    """Why `path` is not laid out as MXNet's NDArray file format (module docstring), one line,
    or None when it is; its data is not read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    try:
        _check(data)
    except _Damaged as err:
        return f"Invalid NDArray file format: the file {err}"
    return None


def check_ndarray_file(path, what=None):
    """UsageError naming `path` (`what`, default the path) unless ndarray_file_problem finds none."""
    problem = ndarray_file_problem(path)
    if problem:
        raise UsageError(f"{what or path} is damaged ({problem})")


def _graph_problem(graph):
    if not isinstance(graph, dict) or not all(isinstance(graph.get(k), list) for k in ("nodes", "arg_nodes", "heads")):
        return "not an MXNet graph: no lists nodes, arg_nodes and heads"
    nodes = graph["nodes"]
    for i, node in enumerate(nodes):
        if not (isinstance(node, dict) and isinstance(node.get("op"), str) and isinstance(node.get("name"), str)):
            return f"node {i} is not an op with a name"
        for entry in node.get("inputs", []):
            if not (isinstance(entry, list) and 2 <= len(entry) <= 3 and all(type(v) is int for v in entry)
                    and 0 <= entry[0] < i and entry[1] >= 0):
                return f"node {i} ({node['name']}) has the input {entry!r}, not an earlier node's output"
    if not all(type(i) is int and 0 <= i < len(nodes) for i in graph["arg_nodes"]):
        return "arg_nodes names a node that is not there"
    for entry in graph["heads"]:
        if not (isinstance(entry, list) and 2 <= len(entry) <= 3 and all(type(v) is int for v in entry)
                and 0 <= entry[0] < len(nodes) and entry[1] >= 0):
            return f"the head {entry!r} is not a node's output"
    if not graph["heads"]:
        return "the graph has no outputs (heads)"
    return None


def symbol_file_problem(path):
    """Why `path` is not an MXNet symbol JSON file (one line), or None when it is one."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
        graph = json.loads(text)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    except (UnicodeDecodeError, ValueError) as err:
        return f"not a symbol JSON file: {' '.join(str(err).split())[:120]}"
    problem = _graph_problem(graph)
    return f"not a symbol JSON file: {problem}" if problem else None
