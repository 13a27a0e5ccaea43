"""The built-in synthetic demo dataset (sample_fc.data.demo): train.rec/.idx/property + demo_val.bin.

    python -m sample_fc.tools.demo_data --out DIR [--seed 0] [--num-identities 200]
        [--images-per-identity 40] [--num-val-identities 100] [--num-pairs 600] [--image-size 32]
"""
import sys

from ..data.demo import (TRAIN, VAL, ensure_demo, identity_template, make_demo,  # noqa: F401  (re-exported)
                         demo_image_count, raw_pixel_accuracy)
from .cli import Progress, check_output_dir, make_parser, run_or_exit


def main(argv=None):
    parser = make_parser("sample_fc.tools.demo_data", __doc__)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0, help="same seed -> byte-identical files")
    parser.add_argument("--num-identities", type=int, default=200, help="training identities")
    parser.add_argument("--images-per-identity", type=int, default=40, help="training images per identity")
    parser.add_argument("--num-val-identities", type=int, default=100,
                        help="held-out identities for demo_val.bin")
    parser.add_argument("--num-pairs", type=int, default=600,
                        help="verification pairs (half same, half different)")
    parser.add_argument("--image-size", type=int, default=32, help="side of the square images")
    args = parser.parse_args(argv)
    bar = Progress(demo_image_count(args.num_identities, args.images_per_identity, args.num_pairs),
                   "demo images")

    def work():
        check_output_dir(args.out, "--out")
        return make_demo(args.out, args.seed, args.num_identities, args.images_per_identity,
                         args.num_val_identities, args.num_pairs, args.image_size, progress=bar.update)

    summary = run_or_exit(parser, work)
    lines = (f"wrote {args.out}: {summary['num_images']} training images of {summary['num_classes']} identities, "
             f"{summary['num_pairs']} pairs of {len(summary['val_identities'])} held-out identities",
             f"raw-pixel cosine baseline on demo_val.bin: {summary['raw_pixel_accuracy']:.4f} (10-fold accuracy)")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
