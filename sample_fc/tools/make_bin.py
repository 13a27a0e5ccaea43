"""Pack a pairs list into an insightface verification .bin.

    python -m sample_fc.tools.make_bin --pairs pairs.txt --out mine.bin [--image-size 112] [--root DIR]

pairs.txt has one pair per line, `path1 path2 1|0` (1: same identity); blank lines and
lines starting with # are skipped. Relative paths are taken from --root, by default the
pairs file's folder. With --image-size S every image is resized to SxS (bilinear). An
image is stored as its original file bytes when it is a JPEG or PNG that needs no resize,
otherwise re-encoded as JPEG, quality 95. Without --image-size all images must already
share one size (a .bin is read back as one array). Errors name the line and the path. A
list verify could not score — fewer than verification.MIN_PAIRS pairs, or only one kind — is
refused before any image is read.
"""
import os
import sys

from ..data.bin_format import write_bin
from ..data.images import encode_jpeg, open_image, rgb_pixels
from ..errors import MissingFileError, UsageError
from ..verification import check_pair_set
from .cli import check_output_folder, make_parser, run_or_exit

KEPT_FORMATS = ("JPEG", "PNG")


def read_pairs(pairs_file, root=None):
    """[(line number, path1, path2, issame)] with paths resolved against root (default: the
    pairs file's folder). MissingFileError for a missing pairs file, UsageError naming the line
    for a malformed one."""
    if not os.path.isfile(pairs_file):
        raise MissingFileError(f"--pairs {pairs_file}: no such file")
    root = os.path.dirname(os.path.abspath(pairs_file)) if root is None else root
    pairs = []
    try:
        with open(pairs_file) as handle:
            lines = handle.readlines()
    except UnicodeDecodeError as err:
        raise UsageError(f"--pairs {pairs_file}: not a text file ({err.reason} at byte {err.start})") from None
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if len(fields) != 3 or fields[2] not in ("0", "1"):
            raise UsageError(f"{pairs_file}:{number}: expected 'path1 path2 1|0', got {line.strip()!r}")
        first, second = (os.path.join(root, p) for p in fields[:2])
        pairs.append((number, first, second, fields[2] == "1"))
    if not pairs:
        raise UsageError(f"{pairs_file}: no pairs")
    return pairs


def encode_image(path, image_size=None):
    """(bytes for the .bin, (width, height) stored): the file itself if it is a JPEG or PNG
    of the right size, else the (resized) image as JPEG quality 95."""
    with open(path, "rb") as handle:
        data = handle.read()
    image = open_image(data)
    target = None if image_size is None else (image_size, image_size)
    if image.format in KEPT_FORMATS and target in (None, image.size):
        return data, image.size
    pixels = rgb_pixels(image, image_size)
    return encode_jpeg(pixels), (pixels.shape[1], pixels.shape[0])


def make_bin(pairs_file, out, image_size=None, root=None):
    """Write the .bin for `pairs_file`; returns the number of pairs. UsageError naming the line
    and path for a pair that cannot be used (a missing or undecodable image, another size)."""
    if image_size is not None and image_size <= 0:
        raise UsageError(f"--image-size must be positive, got {image_size}")
    check_output_folder(out, "--out")
    pairs = read_pairs(pairs_file, root)
    check_pair_set([same for *_, same in pairs], f"--pairs {pairs_file}")
    encoded, images, issame = {}, [], []
    first = None                          # (path, size, line) of the first image
    for number, *paths, same in pairs:
        for path in paths:
            if path not in encoded:
                try:
                    encoded[path], size = encode_image(path, image_size)
                except OSError as err:     # missing, unreadable, or not an image
                    raise UsageError(f"{pairs_file}:{number}: image {path}: {err}") from err
                first = first or (path, size, number)
                if size != first[1]:
                    raise UsageError(
                        f"{pairs_file}:{number}: image {path} is {size[0]}x{size[1]} but "
                        f"{first[0]} (line {first[2]}) is {first[1][0]}x{first[1][1]}; "
                        f"pass --image-size to resize all")
            images.append(encoded[path])
        issame.append(same)
    write_bin(out, images, issame)
    return len(issame)


def main(argv=None):
    parser = make_parser("sample_fc.tools.make_bin", __doc__)
    parser.add_argument("--pairs", required=True, help="pairs file: lines 'path1 path2 1|0'")
    parser.add_argument("--out", required=True, help="the .bin to write")
    parser.add_argument("--image-size", type=int, default=None, help="resize every image to SxS")
    parser.add_argument("--root", default=None,
                        help="folder relative image paths start from (default: the pairs file's)")
    args = parser.parse_args(argv)
    count = run_or_exit(parser, lambda: make_bin(args.pairs, args.out, args.image_size, args.root))
    print(f"wrote {args.out}: {count} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
