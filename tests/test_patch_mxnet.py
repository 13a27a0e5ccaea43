"""Tests for scripts/patch_mxnet.py, the fixes that let mxnet 1.9.1 run with numpy >= 1.24."""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import REPO

SCRIPT = REPO / "scripts" / "patch_mxnet.py"
sys.path.insert(0, str(REPO / "scripts"))
from patch_mxnet import FIXES  # noqa: E402


def _installed_mxnet():
    return Path(importlib.util.find_spec("mxnet").submodule_search_locations[0])


def _original_tree(tmp_path):
    """A package tree holding, in each file the fixes touch, the texts mxnet 1.9.1 ships there
    (each as often as it occurs), between lines that must stay as they are."""
    root = tmp_path / "mxnet"
    for relative in {f for f, _, _, _ in FIXES}:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        parts = [old for fixed_file, old, _, count in FIXES if fixed_file == relative for _ in range(count)]
        (root / relative).write_text("x = _np.bool_\n" + "\n# unrelated\n".join(parts) + "\n")
    return root


def _run(root):
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


def test_the_installed_mxnet_runs_with_this_numpy():
    """Test that the bootstrap patched this environment's mxnet: boolean masks, bool arrays
    and mxnet's tolerance tables work with the installed numpy (1.26 in requirements.txt),
    and no removed alias is left in the patched places."""
    import mxnet as mx
    from mxnet import test_utils
    values = mx.np.array([1.0, 2.0, 3.0])
    mask = mx.np.array([True, False, True], dtype=bool)
    np.testing.assert_array_equal(values[mask].asnumpy(), [1.0, 3.0])
    assert mx.np.zeros(2, dtype=bool).dtype == np.bool_
    assert test_utils.default_rtols()[np.dtype(np.bool_)] == 0
    for relative, old, new, count in FIXES:
        text = (_installed_mxnet() / relative).read_text()
        assert text.count(old) == 0 and text.count(new) >= count, (relative, old)


def test_fixes_apply_once_and_all_or_nothing(tmp_path):
    """Test that the script fixes mxnet 1.9.1's texts, says 'already fixed' on a second run,
    and stops naming the file on a text it does not expect, writing nothing at all."""
    root = _original_tree(tmp_path)
    first = _run(root)
    assert first.returncode == 0 and "file(s) fixed (numpy >= 1.24, start-up)" in first.stdout, first.stderr
    for relative, old, new, count in FIXES:
        text = (root / relative).read_text()
        assert text.count(new) >= count and text.startswith("x = _np.bool_\n"), relative
    again = _run(root)
    assert again.returncode == 0 and "already fixed" in again.stdout
    other = _original_tree(tmp_path / "other")
    (other / "test_utils.py").write_text("a different mxnet\n")        # the last file checked
    before = {p: p.read_text() for p in other.rglob("*.py")}
    refused = _run(other)
    assert refused.returncode != 0 and "test_utils.py" in refused.stderr and "mxnet 1.9.1" in refused.stderr
    assert {p: p.read_text() for p in other.rglob("*.py")} == before
    shutil.rmtree(other)


def test_import_mxnet_leaves_scipy_stats_to_first_use():
    """Test that `import mxnet` no longer loads scipy.stats, and that mxnet's two users of it
    still get the real module when they first use it: the normal distribution's 97.5%
    quantile and the entropy of a fair coin equal their closed forms (None without scipy)."""
    probe = ("import math, sys, mxnet\n"
             "from mxnet import test_utils\n"
             "from mxnet.contrib import quantization\n"
             "print(int('scipy.stats._stats_py' in sys.modules))\n"
             "if test_utils.ss is None:\n"
             "    print('none', int(quantization.stats is None))\n"
             "else:\n"
             "    print(test_utils.ss.norm.ppf(0.975), quantization.stats.entropy([0.5, 0.5]) / math.log(2),\n"
             "          int(quantization.stats is test_utils.ss), int('scipy.stats._stats_py' in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded_at_import, used = result.stdout.split("\n")[:2]
    assert loaded_at_import == "0"
    if importlib.util.find_spec("scipy") is None:
        assert used == "none 1"
        return
    quantile, entropy_bits, same, loaded_after_use = used.split()
    assert abs(float(quantile) - 1.959963984540054) < 1e-12 and abs(float(entropy_bits) - 1.0) < 1e-12
    assert (same, loaded_after_use) == ("1", "1")


def _compiled_ops(cache_folder):
    """scripts/mxnet_compiled_ops.py loaded as a fresh module whose cache file is in `cache_folder`."""
    spec = importlib.util.spec_from_file_location("compiled_ops_under_test", REPO / "scripts" / "mxnet_compiled_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._FILE = str(Path(cache_folder) / "ops.marshal")
    return module


def test_every_operator_function_is_the_code_its_source_compiles_to():
    """Test that with the installed mxnet's cache of operator code (mxnet/_compiled_ops.py), every
    operator function `import mxnet` makes (ndarray, symbol, numpy) gets the code object that
    compiling its generated source (naming this process's handle) gives, all of them from the
    cache, and that the functions mxnet made (e.g. nd.relu, sym.FullyConnected) have that code."""
    probe = (
        "import importlib.util, os, sys\n"
        "folder = importlib.util.find_spec('mxnet').submodule_search_locations[0]\n"
        "spec = importlib.util.spec_from_file_location('mxnet._compiled_ops', os.path.join(folder, '_compiled_ops.py'))\n"
        "ops = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(ops)\n"
        "made, cached_compiled = [], ops.compiled\n"
        "def recording(source, handle):\n"
        "    code = cached_compiled(source, handle)\n"
        "    made.append((source, code))\n"
        "    return code\n"
        "ops.compiled = recording\n"
        "sys.modules['mxnet._compiled_ops'] = ops\n"
        "added_before_done, done = [], ops.done\n"
        "ops.done = lambda: (added_before_done.append(ops._added), done())\n"
        "import mxnet as mx\n"
        "for source, code in made:\n"
        "    assert code == compile(source, '<string>', 'exec'), source\n"
        "for function in (mx.nd.relu, mx.sym.FullyConnected, mx.nd.contrib.box_nms):\n"
        "    assert any(function.__code__ == c for _, m in made for c in m.co_consts if hasattr(c, 'co_code')), function\n"
        "print(len(made), added_before_done[0])\n")
    subprocess.run([sys.executable, "-c", "import mxnet"], check=True, timeout=120)   # the cache is there
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    made, compiled_anew = map(int, result.stdout.split())
    assert made > 2000 and compiled_anew == 0


def test_the_operator_cache_compiles_once_and_survives_a_damaged_file(tmp_path):
    """Test the cache on its own: a function naming a handle compiles to the code compile() gives,
    with the handle in place; a second process (a fresh module) takes it from the file without
    compiling and puts its own handle in; a damaged file or a folder it cannot write is the
    uncached path, with the same code."""
    def source(handle):
        return f"def op(data=None, out=None):\n    return invoke({handle}, data, out, 'op')\n"

    first = _compiled_ops(tmp_path)
    assert first.compiled(source(140234567890123), 140234567890123) == compile(source(140234567890123), "<string>", "exec")
    assert first._added == 1
    first.done()
    assert (tmp_path / "ops.marshal").is_file()
    second = _compiled_ops(tmp_path)
    code = second.compiled(source(139999000011112), 139999000011112)
    assert second._added == 0 and code == compile(source(139999000011112), "<string>", "exec")
    local = {}
    exec(code, {"invoke": lambda *args: args}, local)
    assert local["op"](1, 2) == (139999000011112, 1, 2, "op")
    (tmp_path / "ops.marshal").write_bytes(b"\xe3 not marshal")
    damaged = _compiled_ops(tmp_path)
    assert damaged.compiled(source(7), 7) == compile(source(7), "<string>", "exec")  # a handle that is not an address
    assert damaged.compiled(source(140234567890123), 140234567890123) == compile(source(140234567890123), "<string>", "exec")
    damaged.done()
    assert _compiled_ops(tmp_path)._load() != {}                 # rewritten whole
    unwritable = _compiled_ops(tmp_path / "no such folder")
    assert unwritable.compiled(source(140234567890123), 140234567890123) == compile(source(140234567890123), "<string>", "exec")
    unwritable.done()
    assert not (tmp_path / "no such folder").exists()
