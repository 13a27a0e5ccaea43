"""Tests for sample_fc.data.bin_format: .bin files are read without running anything in them."""
import codecs
import io
import os
import pickle
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sample_fc.data.bin_format import ADMITTED, load_bin, read_bin, write_bin
from sample_fc.data.images import decode_rgb, encode_jpeg
from bench.harness import single_thread_env
from test_tools import STEP, tiny_model

REPO = Path(__file__).resolve().parents[1]
SYSTEM = f"{os.system.__module__}.system"          # posix.system (nt.system on Windows)


class Reduce:
    """Pickles as a call of `function(*args)`: what a crafted .bin uses to run code on load."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def jpegs(count=4):
    return [encode_jpeg(np.full((8, 8, 3), 40 * i + 10, dtype=np.uint8)) for i in range(count)]


def payloads(marker):
    """{kind: (object to pickle, the global it names at protocols 3+, at protocols 0-2, where
    Python 3 writes Python 2's module names)}; each creates `marker` under a plain pickle.load."""
    shell = Reduce(os.system, f"touch {marker}")
    return {
        "os.system": (shell, SYSTEM, SYSTEM),
        "builtins.eval": (Reduce(eval, f"open({str(marker)!r}, 'w').close()"),
                          "builtins.eval", "__builtin__.eval"),
        "subprocess.Popen": (Reduce(subprocess.Popen, ["touch", str(marker)]),
                             "subprocess.Popen", "commands.Popen"),
        "nested in the images": ((jpegs(2)[:1] + [shell] + jpegs(2), [True, False]), SYSTEM, SYSTEM),
    }


def wait_for(path, seconds=10.0):
    """Whether `path` appears within `seconds` (Popen's child creates it asynchronously)."""
    deadline = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return path.exists()


@pytest.mark.parametrize("kind", list(payloads("x")))
def test_payloads_are_live_under_plain_pickle(tmp_path, kind):
    """Test that each crafted payload really runs its command under a plain pickle.load (so the
    refusal tests below are not vacuous)."""
    marker = tmp_path / "pwned"
    content, _, _ = payloads(marker)[kind]
    pickle.loads(pickle.dumps(content, protocol=4), encoding="bytes")
    assert wait_for(marker), f"{kind} payload did not run under pickle.load"


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("kind", list(payloads("x")))
def test_load_bin_refuses_code_before_running_it(tmp_path, kind, protocol):
    """Test that load_bin refuses a .bin naming os.system, builtins.eval or subprocess.Popen
    (also hidden among valid images) with a one-line ValueError naming the file and the global,
    and the command never runs."""
    marker = tmp_path / "pwned"
    content, name, old_name = payloads(marker)[kind]
    path = tmp_path / "evil.bin"
    path.write_bytes(pickle.dumps(content, protocol=protocol))
    with pytest.raises(ValueError) as raised:
        load_bin(str(path))
    message = str(raised.value)
    assert str(path) in message and (name if protocol >= 3 else old_name) in message
    assert "\n" not in message
    assert not marker.exists()


def test_verify_tool_refuses_malicious_bin(tmp_path):
    """Test that `python -m sample_fc.tools.verify` on a .bin that would run a command exits 2
    with one stderr line naming the file and the global, no traceback, and nothing run."""
    checkpoint = tmp_path / "models" / f"step-{STEP:08d}"
    tiny_model(str(checkpoint))
    (checkpoint / "COMPLETE").write_text("{}")
    marker = tmp_path / "pwned"
    evil = tmp_path / "lfw.bin"
    evil.write_bytes(pickle.dumps(payloads(marker)["nested in the images"][0], protocol=4))
    result = subprocess.run([sys.executable, "-m", "sample_fc.tools.verify", "--model",
                             str(tmp_path / "models"), "--bin", str(evil)], cwd=str(REPO),
                            capture_output=True, text=True, timeout=120,
                            env=single_thread_env({"MXNET_SUBGRAPH_VERBOSE": "0"}))  # MXNet's own log line
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("python -m sample_fc.tools.verify: error: ")
    assert str(evil) in lines[0] and SYSTEM in lines[0]
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_numpy_images_and_flags_load_like_bytes(tmp_path, protocol):
    """Test that images as 1-D uint8 NumPy arrays with issame as a bool array (or a list of
    np.bool_) load exactly like the same .bin of bytes and bools, at protocols 2, 4 and 5."""
    encoded, flags = jpegs(), [True, False]
    write_bin(str(tmp_path / "plain.bin"), encoded, flags)
    want_images, want_flags = load_bin(str(tmp_path / "plain.bin"))
    arrays = [np.frombuffer(e, np.uint8) for e in encoded]
    for i, content in enumerate([(arrays, np.array(flags)), (encoded, [np.bool_(f) for f in flags])]):
        path = tmp_path / f"numpy{i}.bin"
        path.write_bytes(pickle.dumps(content, protocol=protocol))
        assert read_bin(str(path))[0] == encoded
        images, issame = load_bin(str(path))
        np.testing.assert_array_equal(images, want_images)
        assert issame.dtype == np.bool_ and issame.tolist() == want_flags.tolist() == flags


class Python2Pickler(pickle._Pickler):
    """Writes bytes and str as Python 2 writes its str: BINSTRING (what published files hold)."""
    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        data = obj if isinstance(obj, bytes) else obj.encode("latin1")
        self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch[bytes] = dispatch[str] = save_py2_str


@pytest.mark.parametrize("numpy_images", [False, True])
def test_python2_files_load(tmp_path, numpy_images):
    """Test that a protocol-2 .bin as Python 2 writes it (str images, and NumPy arrays with
    str dtype codes and data) loads with the images and flags it holds."""
    encoded, flags = jpegs(), [False, True]
    images = [np.frombuffer(e, np.uint8) for e in encoded] if numpy_images else encoded
    buffer = io.BytesIO()
    Python2Pickler(buffer, protocol=2).dump((images, np.array(flags) if numpy_images else flags))
    with pytest.raises(UnicodeDecodeError):
        pickle.loads(buffer.getvalue())                 # Python 2 str: needs encoding='bytes'
    path = tmp_path / "py2.bin"
    path.write_bytes(buffer.getvalue())
    loaded, issame = load_bin(str(path))
    np.testing.assert_array_equal(loaded, np.stack([decode_rgb(e) for e in encoded]))
    assert issame.tolist() == flags


def test_python3_protocol2_bytes_load(tmp_path):
    """Test that a protocol-2 .bin written by Python 3 (bytes as _codecs.encode(str, 'latin1'))
    loads."""
    encoded = jpegs()
    data = pickle.dumps((encoded, [True, True]), protocol=2)
    assert b"_codecs" in data
    (tmp_path / "p2.bin").write_bytes(data)
    assert read_bin(str(tmp_path / "p2.bin"))[0] == encoded


def test_codecs_encode_is_admitted_for_latin1_only(tmp_path):
    """Test that _codecs.encode, admitted for pickled bytes, refuses any codec but latin1."""
    path = tmp_path / "rot13.bin"
    path.write_bytes(pickle.dumps(([Reduce(codecs.encode, "abc", "rot13")] * 2, [True]), protocol=2))
    with pytest.raises(ValueError, match="rot13") as raised:
        load_bin(str(path))
    assert str(path) in str(raised.value)


def test_write_bin_round_trips(tmp_path):
    """Test that a .bin written by write_bin reads back the same bytes, flags and pixels."""
    encoded, flags = jpegs(6), [True, False, True]
    path = str(tmp_path / "round.bin")
    write_bin(path, encoded, flags)
    got, issame = read_bin(path)
    assert got == encoded and issame.tolist() == flags
    images, _ = load_bin(path)
    np.testing.assert_array_equal(images, np.stack([decode_rgb(e) for e in encoded]))


class RecordingUnpickler(pickle.Unpickler):
    """A plain Unpickler that records every global it resolves, as the file names it."""

    def find_class(self, module, name):
        self.names.add((module, name))
        return super().find_class(module, name)


def test_admitted_globals_are_exactly_what_numpy_data_needs():
    """Test that ADMITTED is exactly the set of globals pickles of uint8/bool arrays, np.bool_
    scalars and bytes name at protocols 0-5 (plus NumPy 2's numpy._core spelling), nothing else."""
    samples = [np.array([255, 216, 0], np.uint8), np.array([True, False]), np.bool_(True), b"\xff\xd8"]
    needed = set()
    for protocol in range(6):
        unpickler = RecordingUnpickler(io.BytesIO(pickle.dumps(samples, protocol=protocol)))
        unpickler.names = needed
        unpickler.load()
    assert needed == {("numpy.core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
                      ("numpy.core.numeric", "_frombuffer"), ("numpy.core.multiarray", "scalar"),
                      ("_codecs", "encode")}
    renamed = {(m.replace("numpy.core", "numpy._core"), n) for m, n in needed if m.startswith("numpy.core")}
    assert set(ADMITTED) == needed | renamed


def test_garbage_and_truncated_files_name_the_file(tmp_path):
    """Test that an empty file, garbage bytes, and a valid .bin cut short give a one-line
    ValueError naming the file, not an UnpicklingError or EOFError."""
    write_bin(str(tmp_path / "good.bin"), jpegs(), [True, False])
    good = (tmp_path / "good.bin").read_bytes()
    cases = {"empty": b"", "garbage": b"this is not a pickle\n\x00\xff" * 8,
             "random": np.random.default_rng(0).bytes(500), "truncated": good[:len(good) // 2],
             "persistent id": b"P0\n.", "extension": b"\x80\x02\x82\x01."}
    for name, data in cases.items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(data)
        with pytest.raises(ValueError) as raised:
            load_bin(str(path))
        message = str(raised.value)
        assert message.startswith(f"{path}: not a verification .bin") and "\n" not in message, (name, message)


@pytest.mark.parametrize("content, expected", [
    ({"images": [], "issame": []}, "content is of type dict"),
    ((b"a", b"b", b"c"), "content is of type tuple"),
    ((jpegs(3), [True]), "3 images for 1 pairs; expected 2"),
    ((jpegs(2), [1]), "issame[0] is of type int"),
    ((jpegs(2), np.array([1])), "issame is a int64 array"),
    ((jpegs(2), np.array([[True]])), "issame is a bool array of shape (1, 1)"),
    ((jpegs(2), "10"), "issame is of type str"),
    ((["not bytes", b"x"], [True]), "image 0 is of type str"),
    (([b"x", np.zeros((2, 2), np.uint8)], [True]), "image 1 is a uint8 array of shape (2, 2)"),
    (([b"x", np.zeros(4, np.float32)], [True]), "image 1 is a float32 array"),
    (({b"a": 1}, []), "images are of type dict"),
])
def test_wrong_structure_names_the_file(tmp_path, content, expected):
    """Test that a well-formed pickle of the wrong structure gives a ValueError naming the file
    and what is wrong."""
    path = tmp_path / "wrong.bin"
    path.write_bytes(pickle.dumps(content, protocol=4))
    with pytest.raises(ValueError) as raised:
        load_bin(str(path))
    assert str(raised.value).startswith(f"{path}: ") and expected in str(raised.value), str(raised.value)


def test_array_bigger_than_the_file_is_refused(tmp_path):
    """Test that an image array larger than the whole file (an allocation a few bytes can ask
    for but never fill) is refused instead of being copied."""
    path = tmp_path / "huge.bin"
    path.write_bytes(pickle.dumps(([Reduce(np.ndarray, (10 ** 8,), "u1")] * 2, [True]), protocol=4))
    assert path.stat().st_size < 1000
    with pytest.raises(ValueError, match=r"image 0 is a uint8 array of shape \(100000000,\)"):
        load_bin(str(path))
