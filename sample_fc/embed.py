"""Embed every image of a folder with a trained backbone.

    python -m sample_fc.embed --model models/demo_mbf --images faces/ --out emb.npy

Writes emb.npy, float32 (N, D): one L2-normalised embedding per image, of the image plus
its mirror (as verification embeds; --no-flip for the image alone), and emb.txt beside it
(same name, .txt): the image paths relative to --images, one per line, in row order.
Images are all files with an image extension under --images (recursive), sorted by
relative path, converted to RGB and resized (bilinear) to the model's input size.
"""
import argparse
import os
import sys

import mxnet as mx
import numpy as np
from PIL import Image

from .model_io import add_model_arguments, batch_size_or_default, load_model
from .verification import Embedder, l2_normalize, to_nchw

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def list_images(folder):
    """Relative paths (with '/') of the image files under folder, sorted."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"--images {folder}: not a directory")
    found = []
    for parent, _, names in os.walk(folder):
        for name in names:
            if name.lower().endswith(IMAGE_EXTENSIONS):
                found.append(os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/"))
    if not found:
        raise ValueError(f"--images {folder}: no image files ({', '.join(IMAGE_EXTENSIONS)}) under it")
    return sorted(found)


def read_image(path, image_size):
    """uint8 (S, S, 3) RGB; OSError naming the path if it cannot be decoded."""
    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
    except OSError as err:
        raise OSError(f"{path}: cannot read image ({err})") from err
    if image.size != (image_size, image_size):
        image = image.resize((image_size, image_size), Image.BILINEAR)
    return np.asarray(image)


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
    parser = argparse.ArgumentParser(prog="python -m sample_fc.embed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--images", required=True, metavar="DIR", help="folder of images (recursive)")
    parser.add_argument("--out", required=True, help="output .npy (the path list goes next to it as .txt)")
    parser.add_argument("--no-flip", dest="flip", action="store_false",
                        help="embed each image alone, not image + mirror")
    args = parser.parse_args(argv)
    if not args.out.endswith(".npy"):
        parser.error(f"--out must end in .npy, got {args.out!r}")
    try:
        model = load_model(args.model, args.image_size)
        batch_size = batch_size_or_default(args.batch_size, model)
        embeddings, paths = embed_folder(model, args.images, batch_size, args.context, args.flip)
        np.save(args.out, embeddings)
        with open(paths_file(args.out), "w") as handle:
            handle.writelines(p + "\n" for p in paths)
    except (OSError, ValueError, mx.base.MXNetError) as err:
        parser.exit(1, f"{parser.prog}: error: {err}\n")
    print(f"wrote {args.out} {embeddings.shape} and {paths_file(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
