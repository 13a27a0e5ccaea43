"""insightface verification .bin files: a pickle of (encoded images, issame flags), read safely.

A .bin holds `(bins, issame)`: `bins` a list of 2P encoded images (JPEG/PNG bytes), pair i
being images 2i and 2i+1, and `issame` a list of P bools. Some published files hold the
images as 1-D uint8 NumPy arrays and the flags as a NumPy bool array (or np.bool_ items).
Files written by Python 2 (images as `str`) need encoding='bytes', which also reads Python 3
files.

.bin files come from third-party mirrors, and a plain pickle.load calls whatever the file
names (os.system, builtins.eval, ...). load_bin instead admits only the globals that this
data needs, ADMITTED below, and refuses any other by name before anything is called; then it
checks the structure. Every problem with a file is a UsageError naming it.
"""
import os
import pickle

import numpy as np

from ..errors import UsageError
from .images import BadImages


def _latin1_bytes(text, encoding):
    """_codecs.encode as pickle uses it for bytes at protocols 0-2 (Python 3): latin1 only."""
    if type(text) is not str or encoding != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode({type(text).__name__}, {encoding!r}) refused; "
                                     f"only (str, 'latin1') encodes pickled bytes")
    return text.encode("latin1")


ADMITTED = {
    # a NumPy array at protocols 0-4: _reconstruct(ndarray, (0,), b'b'), then its __setstate__
    ("numpy.core.multiarray", "_reconstruct"): np.core.multiarray._reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    # a NumPy array at protocol 5 (Python 3.8+'s HIGHEST_PROTOCOL): _frombuffer(data, dtype, shape, order)
    ("numpy.core.numeric", "_frombuffer"): np.core.numeric._frombuffer,
    # a NumPy scalar such as an np.bool_ flag in a list: scalar(dtype, raw bytes)
    ("numpy.core.multiarray", "scalar"): np.core.multiarray.scalar,
    # bytes (images, array data) pickled by Python 3 at protocols 0-2: encode(str, 'latin1')
    ("_codecs", "encode"): _latin1_bytes,
}
# NumPy 2 names the same functions numpy._core.*
ADMITTED.update({(module.replace("numpy.core", "numpy._core"), name): value
                 for (module, name), value in list(ADMITTED.items()) if module.startswith("numpy.core")})


class _RefusedGlobal(pickle.UnpicklingError):
    pass


class _BinUnpickler(pickle.Unpickler):
    """An Unpickler that resolves only ADMITTED globals (also for EXT opcodes, which call this)."""

    def find_class(self, module, name):
        if (module, name) not in ADMITTED:
            raise _RefusedGlobal(f"{module}.{name}")
        return ADMITTED[module, name]


def _describe(value):
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    return f"of type {type(value).__name__}"


def read_bin(path):
    """(list of 2P encoded images as bytes, issame np.bool_ (P,)) from a .bin, checked.

    UsageError naming the file if it calls any global outside ADMITTED (refused, not run), is
    not a pickle, or does not hold (images, issame) as described in the module docstring.
    """
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        try:
            content = _BinUnpickler(f, encoding="bytes").load()
        except _RefusedGlobal as err:
            raise UsageError(f"{path}: not a verification .bin: refused to call {err}, which a "
                             f"verification .bin never needs (nothing in the file was run)") from None
        except Exception as err:  # with only ADMITTED callables, any failure means a malformed file
            reason = " ".join(f"{type(err).__name__}: {err}".split())  # one line
            raise UsageError(f"{path}: not a verification .bin (cannot unpickle: {reason})") from None
    if not (isinstance(content, (tuple, list)) and len(content) == 2):
        raise UsageError(f"{path}: not a verification .bin: its content is {_describe(content)}, "
                         f"expected a pair (images, issame)")
    bins, issame = content
    if isinstance(issame, np.ndarray):
        if issame.dtype != np.bool_ or issame.ndim != 1:
            raise UsageError(f"{path}: issame is {_describe(issame)}; expected 1-D bool")
    elif not isinstance(issame, (list, tuple)):
        raise UsageError(f"{path}: issame is {_describe(issame)}; expected a list of bools")
    else:
        for i, flag in enumerate(issame):
            if not isinstance(flag, (bool, np.bool_)):
                raise UsageError(f"{path}: issame[{i}] is {_describe(flag)}; expected a bool")
    if not isinstance(bins, (list, tuple)):
        raise UsageError(f"{path}: images are {_describe(bins)}; expected a list of encoded images")
    if len(bins) != 2 * len(issame):
        raise UsageError(f"{path}: {len(bins)} images for {len(issame)} pairs; expected {2 * len(issame)}")
    encoded = []
    for i, image in enumerate(bins):
        if isinstance(image, bytes):
            encoded.append(image)
        # all of a real array's data is in the file: a bigger one is a never-filled allocation
        elif (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 1
              and image.nbytes <= file_size):
            encoded.append(image.tobytes())
        else:
            raise UsageError(f"{path}: image {i} is {_describe(image)}; expected encoded bytes "
                             f"or a 1-D uint8 array")
    return encoded, np.array(issame, dtype=np.bool_)


def write_bin(path, encoded_images, issame):
    """Write a verification .bin (pickle protocol 4, plain bytes and bools: deterministic)."""
    encoded_images, issame = list(encoded_images), [bool(x) for x in issame]
    if len(encoded_images) != 2 * len(issame):
        raise UsageError(f"{len(encoded_images)} images for {len(issame)} pairs; "
                         f"expected {2 * len(issame)}")
    for i, encoded in enumerate(encoded_images):
        if not isinstance(encoded, bytes):
            raise TypeError(f"image {i} is {type(encoded).__name__}; expected encoded bytes (JPEG or PNG)")
    with open(path, "wb") as f:
        pickle.dump((encoded_images, issame), f, protocol=4)


def load_bin(path, image_size=None, bad=None):
    """Return (images uint8 (2P, H, W, 3) RGB, issame np.bool_ (P,)) from a .bin file.

    The file is read by read_bin (only the data a .bin holds; UsageError naming the file
    otherwise). image_size: None (all images must share one size), an int, or (height,
    width); images of another size are resized (bilinear). bad: images.BadImages deciding on
    an undecodable image (default: a UsageError naming it); a pair with an image it skips is
    left out.
    """
    bins, issame = read_bin(path)
    bad = bad or BadImages(skip=False, hint=None)
    decoded = [bad.decode(data, f"{path}: image {i}", image_size) for i, data in enumerate(bins)]
    kept = [p for p in range(len(issame)) if decoded[2 * p] is not None and decoded[2 * p + 1] is not None]
    if not kept:
        raise UsageError(f"{path}: no pair has two readable images")
    images = [decoded[i] for p in kept for i in (2 * p, 2 * p + 1)]
    issame = np.asarray(issame)[kept]
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        raise UsageError(f"{path}: images have different sizes {sorted(shapes)}; pass image_size to resize")
    return np.stack(images), issame
