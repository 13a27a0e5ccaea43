"""Make mxnet 1.9.1's Python files work with numpy >= 1.24, before scripts/bootstrap.sh uses them.

    python scripts/patch_mxnet.py <the installed mxnet package directory>

numpy 1.24 removed the aliases np.bool, np.int, ... (deprecated since 1.20); mxnet 1.9.1
still uses a few of them, so with a current numpy an NDArray operation fails with
"module 'numpy' has no attribute 'bool'". Each fix below replaces an exact text that must
occur the stated number of times (or is already fixed) with the numpy type it always meant
(np.bool was Python's bool, whose numpy dtype is np.bool_; np.int was Python's int, the
platform's default integer). Anything else stops the bootstrap with the file and text named,
so a different mxnet never gets half-patched. With numpy < 1.24 the patched files behave as
before (np.bool_ and np.int_ exist there too).

Where scipy is installed (the test environment has it), `import mxnet` also imported
scipy.stats, for two things training never calls (int8 calibration by entropy and the
chi-square checks of mxnet.test_utils): over a third of the import's time, paid by every
worker and every tool. Both places now take scipy.stats through importlib's LazyLoader: the
module is found at import (None without scipy, as before) and loaded on first use.

`import mxnet` also compiled the generated source of each of its ~2,300 operator functions, in
every process: mxnet/_compiled_ops.py (scripts/mxnet_compiled_ops.py, copied in) keeps the
code objects in a file in the package and the two places that compiled them ask it instead
(1.19 -> 0.78 s for `import mxnet`); the end of mxnet/__init__.py tells it the import is done.
"""
import sys
from pathlib import Path

LAZY_SCIPY_STATS = '''import sys as _sys


def _scipy_stats_on_first_use():
    """scipy.stats, loaded on first use (sample_fc's scripts/patch_mxnet.py); None without scipy."""
    import importlib.util
    if 'scipy.stats' in _sys.modules:
        return _sys.modules['scipy.stats']
    try:
        spec = importlib.util.find_spec('scipy.stats')
    except ImportError:
        return None
    if spec is None:
        return None
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    _sys.modules['scipy.stats'] = module
    spec.loader.exec_module(module)
    return module


'''

COMPILE_ONCE = ("    local = {}\n    exec(code, None, local)  # pylint: disable=exec-used\n",
                "    local = {}\n    from .._compiled_ops import compiled  # sample_fc's scripts/patch_mxnet.py\n"
                "    exec(compiled(code, handle.value), None, local)  # pylint: disable=exec-used\n")
IMPORT_DONE = ("from . import _api_internal\nfrom . import api\n",
               "from . import _api_internal\nfrom . import _compiled_ops  # sample_fc's scripts/patch_mxnet.py\n"
               "from . import api\n_compiled_ops.done()\n")
NEW_FILES = {"_compiled_ops.py": Path(__file__).resolve().parent / "mxnet_compiled_ops.py"}

FIXES = [   # (file, text, replacement, occurrences)
    ("numpy/utils.py", "bool = onp.bool\n", "bool = onp.bool_\n", 1),
    ("numpy/multiarray.py", "key = array(key, dtype=_np.bool, ctx=self.ctx)",
     "key = array(key, dtype=_np.bool_, ctx=self.ctx)", 1),
    ("numpy/multiarray.py", "key = array(key, dtype=_np.bool)", "key = array(key, dtype=_np.bool_)", 1),
    ("numpy/multiarray.py", "key.dtype == _np.bool:", "key.dtype == _np.bool_:", 1),
    ("symbol/numpy/_symbol.py", "dtype = _np.bool if dtype is None else dtype",
     "dtype = _np.bool_ if dtype is None else dtype", 1),
    ("ndarray/numpy/_op.py", "dtype = _np.bool if dtype is None else dtype",
     "dtype = _np.bool_ if dtype is None else dtype", 1),
    ("test_utils.py", "np.dtype(np.bool): 0,", "np.dtype(np.bool_): 0,", 2),
    ("test_utils.py", "dtype=np.int)", "dtype=np.int_)", 1),
    ("contrib/quantization.py", "try:\n    from scipy import stats\nexcept ImportError:\n    stats = None\n",
     LAZY_SCIPY_STATS + "stats = _scipy_stats_on_first_use()\n", 1),
    ("test_utils.py", "try:\n    import scipy.stats as ss\nexcept ImportError:\n    ss = None\n",
     LAZY_SCIPY_STATS + "ss = _scipy_stats_on_first_use()\n", 1),
    ("ndarray/register.py", *COMPILE_ONCE, 1),
    ("symbol/register.py", *COMPILE_ONCE, 1),
    ("__init__.py", *IMPORT_DONE, 1),
]


def apply_fixes(package_dir):
    """Check every fix against the files first, then write: all fixes or none."""
    texts = {}
    for relative, old, new, count in FIXES:
        path = Path(package_dir) / relative
        if not path.is_file():
            sys.exit(f"patch_mxnet: {path} not found; expected the mxnet 1.9.1 package directory")
        text = texts.setdefault(path, path.read_text())
        found = text.count(old)
        if found == 0 and text.count(new) >= count:
            continue                                        # already fixed
        if found != count:
            sys.exit(f"patch_mxnet: {relative}: expected {old!r} {count} time(s), found it {found} "
                     f"time(s); is this mxnet 1.9.1?")
        texts[path] = text.replace(old, new)
    for relative, source in NEW_FILES.items():
        texts[Path(package_dir) / relative] = source.read_text()
    changed = 0
    for path, text in texts.items():
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            changed += 1
    print(f"patch_mxnet: {changed} file(s) fixed (numpy >= 1.24, start-up)" if changed else
          "patch_mxnet: already fixed")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    apply_fixes(sys.argv[1])
