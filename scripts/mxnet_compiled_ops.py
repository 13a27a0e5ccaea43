"""Operator functions compiled once, not at every import (added by sample_fc's scripts/patch_mxnet.py).

`import mxnet` writes the Python source of each of its ~2,300 operator functions (ndarray,
symbol, numpy) and compiles it: a third of the import's time, paid by every process. A function's
source names its operator's handle, an address that differs from process to process, and is
otherwise the same each time. compiled(source, handle) compiles the source with a placeholder
for the handle once, keeps the code object in a file beside this one (keyed on the source's
digest, for this Python's bytecode), and puts the process's handle in place of the placeholder:
the code object is the one compile() gives for the source itself. Without a cache file, with a
damaged one or a package directory that cannot be written, it compiles as mxnet did. The end of
mxnet/__init__.py calls done(): the file is written if this process compiled anything new, and
the cache is let go (functions made later, e.g. by mx.library.load, compile as before).
"""
import hashlib
import importlib.util
import marshal
import os
import types

_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "_compiled_ops-%s.marshal" % importlib.util.MAGIC_NUMBER.hex())
_cache = None          # {digest of the source with the placeholder: code object}
_added = 0             # code objects compiled in this process and not yet in the file
_done = False          # mxnet's import has finished: compile without the cache


def _load():
    try:
        with open(_FILE, "rb") as handle:
            cache = marshal.load(handle)
        return cache if isinstance(cache, dict) else {}
    except (OSError, EOFError, ValueError, TypeError):
        return {}


def _save():
    """Write the cache (with what this process added) to a temporary file, then rename it in
    place: processes that start at once each write a whole file, the last one stays."""
    if not _added:
        return
    temporary = "%s.%d.tmp" % (_FILE, os.getpid())
    try:
        with open(temporary, "wb") as handle:
            marshal.dump(_cache, handle)
        os.replace(temporary, _FILE)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass


def _with_handle(code, placeholder, handle):
    """`code` with the constant `placeholder` replaced by `handle`, in nested functions too."""
    consts = tuple(handle if type(const) is int and const == placeholder else
                   _with_handle(const, placeholder, handle) if isinstance(const, types.CodeType) else const
                   for const in code.co_consts)
    return code.replace(co_consts=consts)


def compiled(source, handle):
    """The code object of `source` (an operator function's definition naming `handle`)."""
    global _cache, _added
    handle_text = str(handle) if handle else ""
    # the placeholder has the handle's width, so that the code's column positions are the same
    placeholder = "8" * len(handle_text)
    general = source.replace(handle_text, placeholder)
    if _done or len(handle_text) < 6 or source.count(handle_text) != 1 or general.count(placeholder) != 1:
        return compile(source, "<string>", "exec")
    if _cache is None:
        _cache = _load()
    digest = hashlib.sha1(general.encode()).hexdigest()
    code = _cache.get(digest)
    if not isinstance(code, types.CodeType):
        code = _cache[digest] = compile(general, "<string>", "exec")
        _added += 1
    return _with_handle(code, int(placeholder), handle)


def done():
    """mxnet's import has made its operator functions: keep what was new, let the cache go."""
    global _cache, _done
    if _cache is not None:
        _save()
    _cache, _done = None, True
