"""Verification accuracy of a trained backbone on insightface .bin pair sets.

    python -m sample_fc.tools.verify --model models/demo_mbf_small --bin data/lfw.bin [--bin ...]

Prints, per .bin, the line training's verification prints (10-fold accuracy +- std,
TAR@FAR=1e-3, mean embedding norm), computed the same way: verification.Embedder +
verification.evaluate, images loaded with bin_format.load_bin at the model's input size,
and by default batches of the model's training batch size. --baseline adds the raw-pixel
baseline line. Progress lines (count, rate, time left) go to stderr while a set is embedded.
Exits 2 with a message naming the path for a missing file, a bad model, a .bin that is not
one (malformed, or naming code to run: refused by load_bin, never run), an undecodable image
in it (--skip-bad leaves its pair out and counts it), or a set too small to score
(verification.MIN_PAIRS pairs, both kinds).
"""
import os
import sys

from ..data.bin_format import load_bin
from ..data.images import BadImages
from ..errors import MissingFileError
from .model_io import add_model_arguments, batch_size_or_default, load_model_from_args
from ..verification import Embedder, check_pair_set, evaluate, raw_pixel_embed
from . import cli


def make_parser():
    parser = cli.make_parser("sample_fc.tools.verify", __doc__)
    add_model_arguments(parser)
    parser.add_argument("--bin", action="append", required=True, metavar="FILE",
                        help="a verification .bin (repeatable)")
    parser.add_argument("--baseline", action="store_true",
                        help="also print the raw-pixel cosine baseline of each .bin")
    parser.add_argument("--skip-bad", action="store_true",
                        help="leave out the pairs with an undecodable image (counted) instead of failing")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress lines")
    return parser


def bin_name(path):
    """'data/lfw.bin' -> 'lfw', the name training's log uses for a target."""
    return os.path.splitext(os.path.basename(path))[0]


def verify(model, bin_paths, batch_size, ctx, baseline=False, skip_bad=False, progress=True, say=print):
    """[(name, VerificationResult)] for each .bin, plus (name + ' raw-pixel baseline', ...)
    after it when `baseline`. Each set is loaded and checked (check_pair_set) before anything is
    embedded; with skip_bad a pair with an undecodable image is left out and say(line) counts them."""
    sets = []
    for path in bin_paths:
        bad = BadImages(skip_bad)
        images, issame = load_bin(path, model.image_size, bad)   # UsageError naming a bad or unsafe file
        if bad.report():
            say(f"{bad.report()}; their pairs left out, {len(issame)} pairs kept")
        check_pair_set(issame, path)
        sets.append((path, images, issame))
    embed = Embedder(model.symbol, model.arg_params, model.aux_params, ctx, model.image_size,
                     batch_size=batch_size)
    results = []
    for path, images, issame in sets:
        embed.progress = cli.Progress(len(images), f"{bin_name(path)}: embedding", enabled=progress).update
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
        for name, result in verify(model, args.bin, batch_size, args.context, args.baseline, args.skip_bad,
                                   args.progress, lambda line: print(line, file=sys.stderr, flush=True)):
            print(result.line(name), flush=True)

    cli.run_or_exit(parser, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
