"""Images: the one decode (any file Pillow reads -> RGB uint8, resized), the JPEG and
(lossless) PNG encoders, and the one list of file extensions the tools read (pack, embed).

Sizes are an int (square) or (height, width); resizing is bilinear and only happens when
the size differs. Undecodable input raises OSError; callers add where it came from, or let
BadImages decide (the one rule of the tools' --skip-bad: stop naming the image, or skip and count).
"""
import io

import numpy as np
from PIL import Image

from ..errors import UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
JPEG_QUALITY = 95


def is_image_file(name):
    """Whether a file name has one of IMAGE_EXTENSIONS (any case)."""
    return name.lower().endswith(IMAGE_EXTENSIONS)


def open_image(source):
    """A fully decoded PIL image from a path or encoded bytes (OSError if it cannot be)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    else:
        with open(source, "rb") as handle:
            data = handle.read()
    try:
        image = Image.open(io.BytesIO(data))
        image.load()                       # decode now: a truncated file fails here
    except (OSError, ValueError, SyntaxError) as err:   # Pillow raises all three for bad data
        raise OSError(f"cannot decode image ({err})") from err
    except Image.DecompressionBombError as err:          # a damaged header's size, or a bomb
        raise OSError(f"cannot decode image: its header says {err.args[0].split(' exceeds')[0].lower()}, more "
                      f"than Pillow decodes ({Image.MAX_IMAGE_PIXELS * 2:,} pixels); damaged") from err
    return image


def rgb_pixels(image, size=None):
    """uint8 (H, W, 3) RGB pixels of a PIL image, resized to `size` when given and different."""
    image = image.convert("RGB")
    if size is not None:
        height, width = (size, size) if isinstance(size, int) else size
        if image.size != (width, height):
            image = image.resize((width, height), Image.BILINEAR)
    return np.asarray(image)


def decode_rgb(source, size=None):
    """uint8 (H, W, 3) RGB pixels of an image file path or encoded bytes (see rgb_pixels)."""
    return rgb_pixels(open_image(source), size)


class BadImages:
    """What happens to an image that cannot be decoded: without `skip`, a UsageError naming it
    (with `hint`, e.g. "use --skip-bad to skip it"); with `skip`, it is left out and listed in
    `skipped`. decode() returns the pixels, or None for an image left out."""

    def __init__(self, skip=False, hint="use --skip-bad to skip it"):
        self.skip, self.hint, self.skipped = skip, hint, []

    def decode(self, source, name, size=None):
        """decode_rgb(source, size), `name` saying what it is in the messages."""
        try:
            return decode_rgb(source, size)
        except OSError as err:
            if not self.skip:
                hint = f" ({self.hint})" if self.hint else ""
                raise UsageError(f"cannot read image {name}: {err}{hint}") from err
            self.skipped.append(name)
            return None

    def report(self, listed=10):
        """'skipped 2 unreadable images: a.jpg, b.jpg' (the first `listed` names), or None."""
        if not self.skipped:
            return None
        more = f", ... ({len(self.skipped) - listed} more)" if len(self.skipped) > listed else ""
        return f"skipped {len(self.skipped)} unreadable images: {', '.join(map(str, self.skipped[:listed]))}{more}"


def _encode(pixels, image_format, **options):
    """Encoded bytes of (H, W, 3) uint8 RGB pixels or a PIL image (deterministic)."""
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    return buffer.getvalue()


def encode_jpeg(pixels, quality=JPEG_QUALITY):
    """JPEG bytes of (H, W, 3) uint8 RGB pixels or a PIL image (deterministic)."""
    return _encode(pixels, "JPEG", quality=quality)


def encode_png(pixels):
    """PNG bytes (lossless) of (H, W, 3) uint8 RGB pixels or a PIL image (deterministic)."""
    return _encode(pixels, "PNG")
