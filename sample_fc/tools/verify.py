"""Verification accuracy of a trained backbone on insightface .bin pair sets.

    python -m sample_fc.tools.verify --model models/demo_mbf_small --bin data/lfw.bin [--bin ...]

Prints, per .bin, the line training's verification prints (10-fold accuracy +- std,
TAR@FAR=1e-3, mean embedding norm), computed the same way: verification.Embedder +
verification.evaluate, images loaded with bin_format.load_bin at the model's input size,
and by default batches of the model's training batch size. --baseline adds the raw-pixel
baseline line. Exits 1 with a message naming the path for a missing file, a bad model, or
a .bin that is not one (malformed, or naming code to run: refused by load_bin, never run).
"""
import os
import sys

from ..data.bin_format import load_bin
from ..errors import MissingFileError
from .model_io import add_model_arguments, batch_size_or_default, load_model_from_args
from ..verification import Embedder, evaluate, raw_pixel_embed
from . import cli


def make_parser():
    parser = cli.make_parser("sample_fc.tools.verify", __doc__)
    add_model_arguments(parser)
    parser.add_argument("--bin", action="append", required=True, metavar="FILE",
                        help="a verification .bin (repeatable)")
    parser.add_argument("--baseline", action="store_true",
                        help="also print the raw-pixel cosine baseline of each .bin")
    return parser


def bin_name(path):
    """'data/lfw.bin' -> 'lfw', the name training's log uses for a target."""
    return os.path.splitext(os.path.basename(path))[0]


def verify(model, bin_paths, batch_size, ctx, baseline=False):
    """[(name, VerificationResult)] for each .bin, plus (name + ' raw-pixel baseline', ...)
    after it when `baseline`."""
    embed = Embedder(model.symbol, model.arg_params, model.aux_params, ctx, model.image_size,
                     batch_size=batch_size)
    results = []
    for path in bin_paths:
        images, issame = load_bin(path, model.image_size)  # UsageError naming a bad or unsafe file
        results.append((bin_name(path), evaluate(embed, images, issame)))
        if baseline:
            results.append((bin_name(path) + " raw-pixel baseline",
                            evaluate(raw_pixel_embed, images, issame)))
    return results


def main(argv=None):
    parser = make_parser()
    args = parser.parse_args(argv)
    def work():
        missing = [path for path in args.bin if not os.path.isfile(path)]
        if missing:
            raise MissingFileError(f"--bin {missing[0]}: no such file")
        model = load_model_from_args(args)
        batch_size = batch_size_or_default(args.batch_size, model)
        print(f"{model.line()}; batch size {batch_size}, context {args.context}", flush=True)
        for name, result in verify(model, args.bin, batch_size, args.context, args.baseline):
            print(result.line(name), flush=True)

    cli.run_or_exit(parser, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
