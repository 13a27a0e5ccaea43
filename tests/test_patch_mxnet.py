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
    assert first.returncode == 0 and "fixed for numpy >= 1.24" in first.stdout, first.stderr
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
