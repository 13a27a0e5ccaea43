"""Tests for sample_fc.data.mxnet_files: MXNet's symbol JSON and NDArray files checked before
MXNet's loaders read them."""
import json
import struct

import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
from sample_fc.data.mxnet_files import check_ndarray_file, ndarray_file_problem, symbol_file_problem
from sample_fc.errors import UsageError

FIRST_DIM = 36          # byte offset of the first array's first dimension (after magic, stype, ndim)


@pytest.fixture
def params_file(tmp_path):
    path = tmp_path / "model-0001.params"
    mx.nd.save(str(path), {"arg:w": mx.nd.array(np.arange(12, dtype=np.float32).reshape(3, 4)),
                           "aux:m": mx.nd.ones((5,), dtype="float16")})
    return path


def rewritten(path, change):
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))
    return path


def test_files_mxnet_writes_pass_and_load(params_file, tmp_path):
    """Test that what mx.nd.save and Symbol.save write passes both checks (and loads)."""
    assert ndarray_file_problem(str(params_file)) is None
    assert set(mx.nd.load(str(params_file))) == {"arg:w", "aux:m"}
    mx.nd.save(str(tmp_path / "list.params"), [mx.nd.ones((2,))])        # a list: no names
    assert ndarray_file_problem(str(tmp_path / "list.params")) is None
    symbols.get_symbol("mbf_small", 8, 32).save(str(tmp_path / "model-symbol.json"))
    assert symbol_file_problem(str(tmp_path / "model-symbol.json")) is None


@pytest.mark.parametrize("change, reason", [
    (lambda d: struct.pack_into("<q", d, FIRST_DIM, 1 << 40), "ends inside array 0 of shape .*: it needs 17592186044416"),
    (lambda d: struct.pack_into("<Q", d, 16, 1 << 50), "says it holds 1125899906842624 arrays"),
    (lambda d: struct.pack_into("<I", d, 24, 0x12345678), "array 0 starts with 0x12345678"),
    (lambda d: d.__delitem__(slice(len(d) - 3, None)), "ends inside name 1"),
    (lambda d: d.extend(b"garbage"), "has 7 bytes after its last name"),
    (lambda d: d.__setitem__(-1, 0xFF), "name 1 is not UTF-8"),
    (lambda d: d.__delitem__(slice(None)), "does not start as an NDArray file"),
], ids=["huge-dim", "huge-count", "magic", "cut", "appended", "name-bytes", "empty"])
def test_a_damaged_ndarray_file_is_named_before_mxnet_reads_it(params_file, change, reason):
    """Test that a size MXNet would allocate, a cut, appended bytes and a name that is not UTF-8
    are each found in the layout and named, one line, without reading the data."""
    rewritten(params_file, change)
    with pytest.raises(UsageError, match=f"model-0001.params is damaged \\(Invalid NDArray file format: the file "
                                         f"({reason})"):
        check_ndarray_file(str(params_file))


@pytest.mark.parametrize("content, reason", [
    (b"", "Expecting value"),
    (b"\x80\x02\xff binary", "utf-8"),
    (b'{"nodes": [], "arg_nodes": []}', "no lists nodes, arg_nodes and heads"),
    (json.dumps({"nodes": [{"op": "null", "name": "data", "inputs": [[3, 0, 0]]}], "arg_nodes": [0],
                 "heads": [[0, 0, 0]]}).encode(), "node 0 \\(data\\) has the input \\[3, 0, 0\\]"),
    (json.dumps({"nodes": [{"op": "null", "name": "data"}], "arg_nodes": [0], "heads": [[5, 0, 0]]}).encode(),
     "the head \\[5, 0, 0\\]"),
], ids=["empty", "binary", "not-a-graph", "forward-input", "missing-head"])
def test_a_file_that_is_not_a_symbol_is_named(tmp_path, content, reason):
    """Test that an empty, binary or non-graph JSON file is found before mx.sym.load reads it."""
    path = tmp_path / "model-symbol.json"
    path.write_bytes(content)
    assert symbol_file_problem(str(path)) is not None
    assert pytest.importorskip("re").search(reason, symbol_file_problem(str(path)))
