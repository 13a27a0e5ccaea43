"""A real-image data set with many identities: characters (identities) drawn in real fonts
(captures).

    python -m bench.glyphs --out DIR [--identities 5000] [--images-per-identity 12]
        [--val-identities 300] [--pairs 3000] [--image-size 32] [--seed 1] [--charset cjk]
        [--fonts FONT_FILE_OR_DIR ...] [--workers N]

Needs CJK fonts: run scripts/install_glyph_fonts.sh once (apt-get install of Debian's CJK font
packages, about 130 MB; bench/glyph_fonts.py FONT_PACKAGES). Without --fonts, the
fonts are searched in /usr/share/fonts, twins of one design are used once, and the fonts
with the fewest characters are left out when they would leave fewer characters than the
identities need (bench/glyph_fonts.py). Only characters that every font used really
draws qualify (--charset cjk: U+4E00..U+9FFF; latin: Latin, Greek and Cyrillic letters).

An identity is one character; capture k of it is drawn in font k of a seeded per-identity
order of the fonts (a dozen fonts: a dozen captures, cycling when there are more captures),
with a small random shift, scale and rotation, a thinner or bolder stroke, a little blur,
paper and ink levels and noise: grey ink on plain paper, stored as 3-channel JPEG (quality
95). Training and held-out identities are disjoint characters. Writes DIR/train.rec,
train.idx and property (sample_fc.data.recordio), DIR/glyphs_val.bin (--pairs pairs of
held-out characters, half one character in two fonts, half two characters; listed in
glyphs_val.tsv), characters.tsv (split, label, code point, character) and fonts.tsv. Train
on it with

    train.py --dataset demo --set rec=DIR/train.rec --set 'val_targets=["glyphs_val"]'

(num_classes and image_size come from DIR/property). Same seed, fonts and arguments ->
byte-identical files, whatever --workers.
"""
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from sample_fc.data.bin_format import write_bin
from sample_fc.data.demo import raw_pixel_accuracy, verification_pairs
from sample_fc.data.images import encode_jpeg
from sample_fc.data.recordio import RecordWriter
from sample_fc.errors import UsageError
from sample_fc.tools.cli import Progress, make_parser, run_or_exit
from .glyph_fonts import (CHARSETS, FONT_DIRS, choose_faces, drawn_glyphs, fit_faces, list_faces, load_font,
                          no_fonts_message, qualifying_characters)

TRAIN, VAL, SPLIT = 0, 1, 2   # random streams: (seed, stream, code point[, capture])
SUPERSAMPLE = 4               # drawn at 4x the image side, then box-filtered down
EM = 0.7                      # the font's em square: 0.7 of the image side at scale 1


def render_capture(font, char, rng, size):
    """One capture: `char` drawn by `font` (loaded at EM * SUPERSAMPLE * size px) with the
    variation drawn from rng; uint8 (size, size) grey."""
    side = SUPERSAMPLE * size
    glyph = Image.new("L", (2 * side, 2 * side))
    ImageDraw.Draw(glyph).text((side // 2, side // 2), char, font=font, fill=255)
    left, top, right, bottom = glyph.getbbox()        # the ink: a drawn character has some
    # the ink's centre to the image's centre + shift, scaled and rotated (output -> input map)
    scale, angle = rng.uniform(0.85, 1.1), math.radians(np.clip(rng.normal(0, 4), -8, 8))
    shift_x, shift_y = rng.uniform(-0.06, 0.06, 2) * side
    cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
    out_x, out_y = side / 2 + shift_x, side / 2 + shift_y
    in_x, in_y = (left + right) / 2, (top + bottom) / 2
    image = glyph.transform((side, side), Image.AFFINE,
                            (cos, sin, in_x - cos * out_x - sin * out_y,
                             -sin, cos, in_y + sin * out_x - cos * out_y), resample=Image.BILINEAR)
    # stroke weight: a quarter pixel thinner or bolder on each side, or as the font draws it
    weight = rng.choice(3, p=(0.2, 0.5, 0.3))
    if weight != 1:
        image = image.filter(ImageFilter.MinFilter(3) if weight == 0 else ImageFilter.MaxFilter(3))
    blur = rng.uniform(0, 0.6)                        # px of the output image
    if blur > 0.15:
        image = image.filter(ImageFilter.GaussianBlur(blur * SUPERSAMPLE))
    ink = np.asarray(image.reduce(SUPERSAMPLE), np.float32) / 255
    paper, pen, noise = rng.uniform(190, 250), rng.uniform(0, 70), rng.uniform(1, 6)
    pixels = paper + (pen - paper) * ink + rng.normal(0, noise, ink.shape) + 0.5
    return np.clip(pixels, 0, 255).astype(np.uint8)


def capture_face(faces, seed, stream, code, k):
    """The face capture k of character `code` is drawn in: font k of its seeded order."""
    return faces[np.random.default_rng((seed, stream, code)).permutation(len(faces))[k % len(faces)]]


def _render_identity(task):
    """JPEG bytes of `count` captures of one character (a worker's unit of work)."""
    faces, size, seed, stream, code, count = task
    encoded = []
    for k in range(count):
        face = capture_face(faces, seed, stream, code, k)
        font = load_font(face.path, face.index, round(EM * SUPERSAMPLE * size))
        pixels = render_capture(font, chr(code), np.random.default_rng((seed, stream, code, k)), size)
        encoded.append(encode_jpeg(np.repeat(pixels[:, :, None], 3, axis=2)))
    return encoded


def find_fonts(fonts, charset, needed, pool):
    """(faces, qualifying code points, lines to tell): the faces to draw with and the
    characters all of them draw. UsageError for fewer than 2 usable faces."""
    searched = list(fonts or FONT_DIRS)
    faces, skipped = choose_faces(list_faces(searched), charset)
    if len(faces) < 2:
        raise UsageError(no_fonts_message(faces, charset, searched))
    glyphs = list(pool.map(drawn_glyphs, faces, [CHARSETS[charset][0]] * len(faces)))
    left_out = []
    if not fonts:                                    # found, not chosen: leave out the poorest
        faces, glyphs, left_out = fit_faces(faces, glyphs, needed)
    codes, lookalikes = qualifying_characters(glyphs)
    notes = [f"fonts: {len(faces)} used: " + "; ".join(f"{f} {len(g)} chars" for f, g in zip(faces, glyphs))]
    twins = [face.name for face, why in skipped if why.startswith("draws like")]
    if twins:
        notes.append(f"  skipped {len(twins)} twin(s) of these: {', '.join(twins)}")
    notes += [f"  left out {face}: {why}" for face, why in left_out]
    notes.append(f"characters: {len(codes)} of --charset {charset}'s {len(CHARSETS[charset][0])} are drawn by "
                 f"all {len(faces)} fonts ({lookalikes} lookalikes left out)")
    return faces, codes, notes


class _InProcess:
    """What build_glyphs uses of a process pool, in this process (--workers 1)."""

    @staticmethod
    def map(fn, *iterables, chunksize=1):
        return map(fn, *iterables)


def build_glyphs(out, identities=5000, images_per_identity=12, val_identities=300, pairs=3000, image_size=32,
                 seed=1, fonts=None, charset="cjk", workers=None, progress=True, log=print):
    """Write the data set to `out` (see the module docstring); return a summary dict.
    UsageError naming a bad value, too few fonts or too few qualifying characters."""
    for name, value, low in (("identities", identities, 1), ("images_per_identity", images_per_identity, 1),
                             ("val_identities", val_identities, 2), ("pairs", pairs, 2),
                             ("image_size", image_size, 8), ("seed", seed, 0), ("workers", workers or 1, 1)):
        if not (isinstance(value, int) and value >= low):
            raise UsageError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
    if charset not in CHARSETS:
        raise UsageError(f"--charset {charset!r}: choose one of {', '.join(CHARSETS)}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out} is a file, not a folder")
    start, workers = time.monotonic(), workers or os.cpu_count()
    needed = identities + val_identities
    pool = ProcessPoolExecutor(workers, multiprocessing.get_context("spawn")) if workers > 1 else None
    runner = pool or _InProcess()
    try:
        faces, codes, notes = find_fonts(fonts, charset, needed, runner)
        for line in notes:
            log(line)
        if len(codes) < needed:
            raise UsageError(f"only {len(codes)} characters are drawn by all {len(faces)} fonts; --identities "
                             f"{identities} + --val-identities {val_identities} need {needed}")
        chosen = np.random.default_rng((seed, SPLIT)).permutation(len(codes))[:needed]
        train = sorted(codes[i] for i in chosen[:identities])
        held_out = sorted(codes[i] for i in chosen[identities:])
        bar = Progress(identities * images_per_identity + 2 * pairs, "glyph images", enabled=progress)
        os.makedirs(out, exist_ok=True)
        with RecordWriter(os.path.join(out, "train"), image_size) as writer:
            tasks = [(faces, image_size, seed, TRAIN, code, images_per_identity) for code in train]
            for encoded in runner.map(_render_identity, tasks, chunksize=8):
                writer.add_identity(encoded)
                bar.update(len(encoded))
            writer.finish()
        # pairs of held-out characters; one character's images are its captures 0, 1, ... in
        # slot order, so a same pair (adjacent slots) is drawn in two different fonts
        slots, issame = verification_pairs(np.random.default_rng((seed, VAL)), val_identities, pairs)
        counts = np.bincount(slots, minlength=val_identities)
        images = [None] * len(slots)
        tasks = [(faces, image_size, seed, VAL, held_out[v], int(counts[v])) for v in range(val_identities)]
        for v, encoded in enumerate(runner.map(_render_identity, tasks, chunksize=8)):
            for slot, data in zip(np.nonzero(slots == v)[0], encoded):
                images[slot] = data
            bar.update(len(encoded))
    finally:
        if pool is not None:
            pool.shutdown()
    write_bin(os.path.join(out, "glyphs_val.bin"), images, issame)
    capture = np.zeros(len(slots), int)
    for v in range(val_identities):
        capture[slots == v] = np.arange(counts[v])
    with open(os.path.join(out, "glyphs_val.tsv"), "w") as f:
        f.write("pair\tsame\tchar1\tfont1\tchar2\tfont2\n")
        for i, same in enumerate(issame):
            sides = [(held_out[slots[s]], capture[s]) for s in (2 * i, 2 * i + 1)]
            f.write(f"{i}\t{int(same)}\t" + "\t".join(
                f"{chr(code)}\t{capture_face(faces, seed, VAL, code, k).name}" for code, k in sides) + "\n")
    with open(os.path.join(out, "characters.tsv"), "w") as f:
        f.write("split\tlabel\tcode\tchar\n")
        for split, listed in (("train", train), ("val", held_out)):
            f.writelines(f"{split}\t{label}\tU+{code:04X}\t{chr(code)}\n" for label, code in enumerate(listed))
    with open(os.path.join(out, "fonts.tsv"), "w") as f:
        f.write("name\tpath\tindex\n")
        f.writelines(f"{face.name}\t{face.path}\t{face.index}\n" for face in faces)
    size = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    return {"out": out, "identities": identities, "images": identities * images_per_identity,
            "val_identities": val_identities, "pairs": pairs, "fonts": [face.name for face in faces],
            "qualifying": len(codes), "bytes": size, "seconds": time.monotonic() - start,
            "raw_pixel_accuracy": raw_pixel_accuracy(os.path.join(out, "glyphs_val.bin"))}


def main(argv=None):
    parser = make_parser("bench.glyphs", __doc__)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--identities", type=int, default=5000, help="training identities (characters)")
    parser.add_argument("--images-per-identity", type=int, default=12, help="training captures per character")
    parser.add_argument("--val-identities", type=int, default=300, help="held-out characters for glyphs_val.bin")
    parser.add_argument("--pairs", type=int, default=3000, help="verification pairs (half same, half different)")
    parser.add_argument("--image-size", type=int, default=32, help="side of the square images, px")
    parser.add_argument("--seed", type=int, default=1, help="same seed, fonts and arguments -> the same bytes")
    parser.add_argument("--charset", default="cjk", choices=sorted(CHARSETS),
                        help="cjk: U+4E00..U+9FFF; latin: Latin, Greek and Cyrillic letters")
    parser.add_argument("--fonts", nargs="+", default=None, metavar="FONT_FILE_OR_DIR",
                        help="fonts to draw with (default: those in /usr/share/fonts with the charset)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="render processes")
    args = parser.parse_args(argv)
    summary = run_or_exit(parser, lambda: build_glyphs(
        args.out, args.identities, args.images_per_identity, args.val_identities, args.pairs, args.image_size,
        args.seed, args.fonts, args.charset, args.workers))
    print(f"wrote {args.out}: {summary['identities']} identities, {summary['images']} training images "
          f"({args.image_size} px) in {len(summary['fonts'])} fonts; {summary['pairs']} pairs of "
          f"{summary['val_identities']} held-out characters; {summary['bytes'] / 1e6:.1f} MB in "
          f"{summary['seconds']:.0f} s; raw-pixel cosine baseline on glyphs_val.bin: "
          f"{summary['raw_pixel_accuracy']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
