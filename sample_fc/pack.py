"""Pack a folder of face images into an insightface RecordIO dataset.

    python -m sample_fc.pack --images DIR --out PREFIX [--image-size 112] [--skip-bad] [--quality 95]

DIR holds one subfolder per identity; sorted folder names become ids 0..K-1 (a folder with
no usable image keeps its id and gets an empty range). Images (.jpg/.jpeg/.png) are
converted to RGB, resized (bilinear) to image_size x image_size when needed and re-encoded
as JPEG. Output: PREFIX.rec, PREFIX.idx and `property` in PREFIX's folder, laid out as in
sample_fc/record_index.py (image keys 1..N, identity records after them, header record 0
written last as insightface's own tools do; the .idx maps every key to its offset).
"""
import argparse
import io
import os
import sys
import time

import mxnet as mx
from PIL import Image

from .record_index import FLOAT32_EXACT_LIMIT, write_property

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def encode_jpeg(image, quality=95):
    """Encode a PIL image or an (H, W, 3) uint8 RGB array as JPEG bytes (deterministic)."""
    if not isinstance(image, Image.Image):
        image = Image.fromarray(image)
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


class RecordWriter:
    """Write identities in id order, then the identity records, header and `property`.

    Use as a context manager; if the block raises, the partial .rec/.idx are deleted.
    """

    def __init__(self, out_prefix, image_size):
        self.folder = os.path.dirname(os.path.abspath(out_prefix))
        os.makedirs(self.folder, exist_ok=True)
        self.paths = (out_prefix + ".rec", out_prefix + ".idx")
        self.image_size = image_size
        self._writer = mx.recordio.MXIndexedRecordIO(self.paths[1], self.paths[0], "w")
        self.ranges = []  # (first_image_key, end_image_key) per identity
        self._next_key = 1

    def add_identity(self, encoded_images):
        """Write the encoded images of the next identity (id = number of identities so far)."""
        label, first = len(self.ranges), self._next_key
        for encoded in encoded_images:
            header = mx.recordio.IRHeader(0, float(label), self._next_key, 0)
            self._writer.write_idx(self._next_key, mx.recordio.pack(header, encoded))
            self._next_key += 1
        self.ranges.append((first, self._next_key))
        return label

    def finish(self):
        """Write identity records, header record 0 and `property`; return (images, identities)."""
        start = self._next_key
        end = start + len(self.ranges)
        if end >= FLOAT32_EXACT_LIMIT:
            raise ValueError(f"{end} records exceed what float32 RecordIO labels address exactly (2**24)")
        for key, image_range in enumerate(self.ranges, start=start):
            self._writer.write_idx(key, mx.recordio.pack(mx.recordio.IRHeader(0, image_range, key, 0), b""))
        self._writer.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(0, (start, end), 0, 0), b""))
        self._writer.close()
        write_property(self.folder, len(self.ranges), self.image_size, self.image_size)
        return start - 1, len(self.ranges)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._writer.close()
            for path in self.paths:
                if os.path.exists(path):
                    os.remove(path)


class Progress:
    """A one-line progress bar on stderr, redrawn at most every 0.2 s (only the end if not a tty)."""

    def __init__(self, total, what, enabled=True):
        self.total, self.what, self.enabled, self.done, self._last = total, what, enabled, 0, 0.0
        self.live = enabled and sys.stderr.isatty()

    def update(self, n=1):
        self.done += n
        now = time.monotonic()
        if (self.live and now - self._last > 0.2) or (self.enabled and self.done >= self.total):
            self._last = now
            filled = int(30 * self.done / max(self.total, 1))
            bar = "#" * filled + "." * (30 - filled)
            sys.stderr.write(f"\r{self.what} [{bar}] {self.done}/{self.total}")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def list_identities(images_dir):
    """Return [(identity_name, [image paths sorted])] for the sorted subfolders of images_dir."""
    if not os.path.isdir(images_dir):
        raise FileNotFoundError(f"images folder not found: {images_dir}")
    names = sorted(n for n in os.listdir(images_dir)
                   if not n.startswith(".") and os.path.isdir(os.path.join(images_dir, n)))
    if not names:
        raise ValueError(f"{images_dir} has no identity subfolders (expected DIR/<identity>/<image>.jpg)")
    listing = []
    for name in names:
        folder = os.path.join(images_dir, name)
        listing.append((name, sorted(os.path.join(folder, f) for f in os.listdir(folder)
                                     if f.lower().endswith(IMAGE_EXTENSIONS))))
    return listing


def pack_folder(images_dir, out_prefix, image_size=112, skip_bad=False, quality=95, progress=True):
    """Pack images_dir into out_prefix.rec/.idx + property; return a summary dict.

    Unreadable images raise OSError naming the file, unless skip_bad, in which case they are
    left out and listed in summary['skipped'].
    """
    if not (isinstance(image_size, int) and image_size > 0):
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    if not (isinstance(quality, int) and 1 <= quality <= 100):
        raise ValueError(f"quality must be an integer in [1, 100], got {quality!r}")
    identities = list_identities(images_dir)
    skipped = []
    bar = Progress(sum(len(paths) for _, paths in identities), "packing", enabled=progress)

    def encoded_images(paths):
        for path in paths:
            bar.update()
            try:
                with Image.open(path) as opened:
                    image = opened.convert("RGB")
            except (OSError, ValueError) as err:
                if not skip_bad:
                    raise OSError(f"cannot read image {path}: {err} (use --skip-bad to skip it)") from err
                skipped.append(path)
                continue
            if image.size != (image_size, image_size):
                image = image.resize((image_size, image_size), Image.BILINEAR)
            yield encode_jpeg(image, quality)

    with RecordWriter(out_prefix, image_size) as writer:
        for _, paths in identities:
            writer.add_identity(encoded_images(paths))
        num_images, num_identities = writer.finish()
    empty = [name for (name, _), (a, b) in zip(identities, writer.ranges) if a == b]
    return {"num_images": num_images, "num_identities": num_identities, "skipped": skipped,
            "empty_identities": empty, "rec": writer.paths[0], "idx": writer.paths[1]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", required=True, help="folder with one subfolder of images per identity")
    parser.add_argument("--out", required=True,
                        help="output prefix: writes PREFIX.rec, PREFIX.idx and property beside them")
    parser.add_argument("--image-size", type=int, default=112, help="side of the square output images")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable images instead of failing")
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality of the packed images")
    args = parser.parse_args(argv)
    summary = pack_folder(args.images, args.out, args.image_size, args.skip_bad, args.quality)
    print(f"wrote {summary['rec']}: {summary['num_images']} images, {summary['num_identities']} identities")
    if summary["skipped"]:
        print(f"skipped {len(summary['skipped'])} unreadable images:", *summary["skipped"],
              sep="\n  ", file=sys.stderr)
    if summary["empty_identities"]:
        print(f"{len(summary['empty_identities'])} identities have no images:",
              *summary["empty_identities"], sep="\n  ", file=sys.stderr)


if __name__ == "__main__":
    main()
