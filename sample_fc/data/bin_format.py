"""insightface verification .bin files: pickle of (encoded images, issame flags).

A .bin holds `(bins, issame)`: `bins` a list of 2P encoded images (JPEG/PNG bytes), pair i
being images 2i and 2i+1, and `issame` a list of P bools. Files written by Python 2 need
pickle.load(f, encoding='bytes'), which also reads Python 3 files.
"""
import pickle

import numpy as np

from .images import decode_rgb


def write_bin(path, encoded_images, issame):
    """Write a verification .bin (pickle protocol 4, plain bytes and bools: deterministic)."""
    encoded_images, issame = list(encoded_images), [bool(x) for x in issame]
    if len(encoded_images) != 2 * len(issame):
        raise ValueError(f"{len(encoded_images)} images for {len(issame)} pairs; "
                         f"expected {2 * len(issame)}")
    for i, encoded in enumerate(encoded_images):
        if not isinstance(encoded, bytes):
            raise TypeError(f"image {i} is {type(encoded).__name__}; expected encoded bytes (JPEG or PNG)")
    with open(path, "wb") as f:
        pickle.dump((encoded_images, issame), f, protocol=4)


def load_bin(path, image_size=None):
    """Return (images uint8 (2P, H, W, 3) RGB, issame np.bool_ (P,)) from a .bin file.

    image_size: None (all images must share one size), an int, or (height, width); images of
    another size are resized (bilinear).
    """
    with open(path, "rb") as f:
        bins, issame = pickle.load(f, encoding="bytes")
    issame = np.asarray(issame, dtype=np.bool_)
    if len(bins) != 2 * len(issame):
        raise ValueError(f"{path}: {len(bins)} images for {len(issame)} pairs; expected {2 * len(issame)}")
    images = []
    for i, encoded in enumerate(bins):
        data = encoded.tobytes() if isinstance(encoded, np.ndarray) else bytes(encoded)
        try:
            images.append(decode_rgb(data, image_size))
        except OSError as err:
            raise ValueError(f"{path}: image {i}: {err}") from err
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        raise ValueError(f"{path}: images have different sizes {sorted(shapes)}; pass image_size to resize")
    return np.stack(images), issame
