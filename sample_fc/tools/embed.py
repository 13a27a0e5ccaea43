"""Embed every image of a folder with a trained backbone.

    python -m sample_fc.tools.embed --model models/demo_mbf_small --images faces/ --out emb.npy

Writes emb.npy, float32 (N, D): one L2-normalised embedding per image, of the image plus
its mirror (as verification embeds; --no-flip for the image alone), and emb.txt beside it
(same name, .txt): the image paths relative to --images, one per line, in row order.
Images are all files with an image extension under --images (recursive), sorted by
relative path, converted to RGB and resized (bilinear) to the model's input size.
"""
import os
import sys

import numpy as np

from ..data.images import IMAGE_EXTENSIONS, decode_rgb, is_image_file
from ..errors import MissingFileError, UsageError
from ..verification import Embedder, l2_normalize, to_nchw
from .cli import check_output_folder, make_parser, run_or_exit
from .model_io import add_model_arguments, batch_size_or_default, load_model_from_args


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
    try:
        return decode_rgb(path, image_size)
    except OSError as err:
        raise UsageError(f"{path}: {err}") from err


def embed_folder(model, folder, batch_size, ctx, flip=True):
    """(embeddings float32 (N, D) L2-normalised, relative paths) of the images in folder,
    read one batch at a time."""
    paths = list_images(folder)
    embedder = Embedder(model.symbol, model.arg_params, model.aux_params, ctx, model.image_size,
                        batch_size=batch_size, flip=flip)
    rows = []
    for start in range(0, len(paths), batch_size):
        batch = np.stack([read_image(os.path.join(folder, p), model.image_size)
                          for p in paths[start:start + batch_size]])
        batch = to_nchw(batch)
        rows.append(embedder(batch))
    return l2_normalize(np.concatenate(rows)).astype(np.float32), paths


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
    args = parser.parse_args(argv)
    if not args.out.endswith(".npy"):
        parser.error(f"--out must end in .npy, got {args.out!r}")
    def work():
        check_output_folder(args.out, "--out")
        model = load_model_from_args(args)
        print(model.line(), flush=True)
        batch_size = batch_size_or_default(args.batch_size, model)
        embeddings, paths = embed_folder(model, args.images, batch_size, args.context, args.flip)
        np.save(args.out, embeddings)
        with open(paths_file(args.out), "w") as handle:
            handle.writelines(p + "\n" for p in paths)
        return embeddings

    embeddings = run_or_exit(parser, work)
    print(f"wrote {args.out} {embeddings.shape} and {paths_file(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
