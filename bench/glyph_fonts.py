"""The fonts of the glyph data set (bench.glyphs): the faces found, which characters
each really draws, and which faces are one design under two names.

A face is one font of a file (a .ttc holds several: ImageFont.truetype(path, size, index=i)).
A face draws a character when its rendering is neither empty nor the face's .notdef box (the
rendering of an unassigned code point), and, where fontTools is installed, its cmap maps it.
A face that draws the charset's probe characters nearly as a face kept before it does (their
inks overlap by TWIN_LIKENESS or more) is the same design and is skipped: a .ttc's regional,
monospaced or proportional twin, or a font shipped twice. Two characters that one kept face
draws pixel for pixel alike are one identity, not two (Latin A, Greek Alpha, Cyrillic A):
only the first of them qualifies.
"""
import hashlib
import os
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageFont

from sample_fc.errors import MissingFileError, UsageError

FONT_DIRS = ("/usr/share/fonts",)            # searched when no --fonts are given
FONT_EXTENSIONS = (".ttf", ".otf", ".ttc", ".otc")
# Debian packages of CJK fonts of distinct designs, installed by scripts/install_glyph_fonts.sh:
# 14 fonts, 7,792 characters drawn by all (others are twins of these: fonts-wqy-microhei of
# Droid, fonts-ipafont-* of fonts-ipaexfont-*; fonts-motoya-l-cedar would cut the 7,792 to 5,648)
FONT_PACKAGES = ("fonts-noto-cjk", "fonts-arphic-ukai", "fonts-arphic-uming", "fonts-cwtex-kai",
                 "fonts-cwtex-ming", "fonts-droid-fallback", "fonts-hanazono", "fonts-ipaexfont-gothic",
                 "fonts-ipaexfont-mincho", "fonts-seto", "fonts-wqy-zenhei")
CHECK_SIZE = 32                              # px: above the embedded bitmap sizes of CJK fonts
UNASSIGNED = "\u0378"                        # no font maps it: its rendering is the .notdef glyph
TWIN_LIKENESS = 0.8                          # likeness() from which a face is a twin (twins: 0.87-1)


def _letters(*ranges):
    return [c for lo, hi in ranges for c in range(lo, hi + 1) if unicodedata.category(chr(c)).startswith("L")]


CHARSETS = {  # name: (code points, probe characters every face of the charset must draw)
    # the probe: characters of Japanese (JIS), simplified (GB) and traditional (Big5) sets alike
    "cjk": (list(range(0x4E00, 0xA000)), "一人大中上下日月山水木火土金石天地小口目手田心力"),
    "latin": (_letters((0x41, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF)), "AaBbEeGgKkMmQqRrSsWwYy"),
}


@dataclass(frozen=True)
class Face:
    """One font of a font file: where it is and what it is called."""
    path: str
    index: int
    name: str

    def __str__(self):
        return f"{self.name} ({os.path.basename(self.path)}" + (f" #{self.index})" if self.index else ")")


@lru_cache(maxsize=64)
def load_font(path, index, size):
    """The face at `size` px, laid out without shaping (one character at a time; 7x faster on
    OpenType CJK fonts than raqm)."""
    return ImageFont.truetype(path, size, index=index, layout_engine=ImageFont.Layout.BASIC)


def _font_files(paths):
    for path in paths:
        if os.path.isdir(path):
            for folder, _, names in sorted(os.walk(path)):
                yield from (os.path.join(folder, n) for n in sorted(names) if n.lower().endswith(FONT_EXTENSIONS))
        elif os.path.isfile(path):
            yield path
        else:
            raise MissingFileError(f"--fonts {path}: no such file or folder")


def list_faces(paths):
    """Every face of the font files in `paths` (files, or folders searched recursively), each
    file once (symlinks resolved), in path order. UsageError for a named file that is no font."""
    faces, seen = [], set()
    for path in _font_files(paths):
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        for index in range(256):
            try:
                font = ImageFont.truetype(real, CHECK_SIZE, index=index)
            except OSError:
                if index == 0 and path in paths:
                    raise UsageError(f"--fonts {path}: not a font file FreeType can read") from None
                break
            faces.append(Face(real, index, " ".join(part for part in font.getname() if part)))
    return faces


def glyph_signature(font, char):
    """A digest of `char`'s rendering by `font` (size and pixels), or None if it draws nothing."""
    mask = font.getmask(char)
    if mask.size[0] == 0 or mask.size[1] == 0 or max(bytes(mask)) == 0:
        return None
    return hashlib.blake2b(repr(mask.size).encode() + bytes(mask), digest_size=8).digest()


def _cmap(face):
    """The code points the face's cmap maps, or None when fontTools is not installed."""
    try:
        from fontTools.ttLib import TTFont
    except ImportError:
        return None
    font = TTFont(face.path, fontNumber=face.index, lazy=True)
    return set(font.getBestCmap() or ())


def drawn_glyphs(face, codes):
    """{code: signature} of the characters among `codes` that `face` really draws."""
    font = load_font(face.path, face.index, CHECK_SIZE)
    notdef, mapped = glyph_signature(font, UNASSIGNED), _cmap(face)
    drawn = {}
    for code in codes:
        if mapped is None or code in mapped:
            signature = glyph_signature(font, chr(code))
            if signature is not None and signature != notdef:
                drawn[code] = signature
    return drawn


def probe_inks(face, probe):
    """The face's probe characters at CHECK_SIZE, each centred by its ink on a 2x canvas:
    float (len(probe), 2 * CHECK_SIZE, 2 * CHECK_SIZE) in [0, 1]."""
    font, side = load_font(face.path, face.index, CHECK_SIZE), 2 * CHECK_SIZE
    inks = np.zeros((len(probe), side, side), np.float32)
    for ink, char in zip(inks, probe):
        mask = font.getmask(char)
        width, height = min(mask.size[0], side), min(mask.size[1], side)
        pixels = np.asarray(Image.frombytes("L", mask.size, bytes(mask)), np.float32) / 255
        top, left = (side - height) // 2, (side - width) // 2
        ink[top:top + height, left:left + width] = pixels[:height, :width]
    return inks


def likeness(inks, others):
    """How alike two faces draw the probe: the mean over characters of the inks' overlap
    (sum of min / sum of max): 1 for a twin, under 0.65 for distinct designs (CJK fonts)."""
    overlap = np.minimum(inks, others).sum(axis=(1, 2)) / np.maximum(np.maximum(inks, others).sum(axis=(1, 2)), 1e-6)
    return float(overlap.mean())


def choose_faces(faces, charset):
    """(kept, skipped): the faces that draw every probe character of `charset`, less the twins
    of a face kept before them; skipped is [(face, why)]."""
    probe = CHARSETS[charset][1]
    kept, inks, skipped = [], [], []
    for face in faces:
        drawn = drawn_glyphs(face, [ord(c) for c in probe])
        if len(drawn) < len(probe):
            skipped.append((face, f"draws {len(drawn)} of the {len(probe)} probe characters"))
            continue
        mine = probe_inks(face, probe)
        twin = next((other for other, theirs in zip(kept, inks) if likeness(mine, theirs) >= TWIN_LIKENESS), None)
        if twin is not None:
            skipped.append((face, f"draws like {twin.name}"))
            continue
        kept.append(face)
        inks.append(mine)
    return kept, skipped


def no_fonts_message(found, charset, searched):
    """The one line for fewer than 2 usable faces: what was found and what to install."""
    where = ", ".join(searched)
    hint = (f"install CJK fonts: scripts/install_glyph_fonts.sh (apt-get install {' '.join(FONT_PACKAGES)})"
            if charset == "cjk" else "pass font files or folders with --fonts")
    return (f"found {len(found)} usable font(s) for --charset {charset} in {where}"
            f"{': ' + ', '.join(f.name for f in found) if found else ''}; at least 2 are needed; {hint}")


def qualifying_characters(glyphs):
    """The code points that every face draws (glyphs: one {code: signature} per face), sorted,
    less lookalikes: a character that some face draws exactly like an earlier qualifying one."""
    common = sorted(set.intersection(*(set(g) for g in glyphs)))
    seen = [set() for _ in glyphs]
    kept = []
    for code in common:
        if any(g[code] in s for g, s in zip(glyphs, seen)):
            continue
        for g, s in zip(glyphs, seen):
            s.add(g[code])
        kept.append(code)
    return kept, len(common) - len(kept)


def fit_faces(faces, glyphs, needed):
    """(faces, glyphs, left out [(face, why)]) for fonts found rather than chosen: taken by
    the characters they draw, most first, always the first two; a later one that would leave
    fewer than `needed` qualifying characters is left out. Kept in their original order."""
    order = sorted(range(len(faces)), key=lambda i: -len(glyphs[i]))
    kept, left_out = order[:2], []
    for i in order[2:]:
        count = len(qualifying_characters([glyphs[j] for j in kept + [i]])[0])
        if count < needed:
            left_out.append((faces[i], f"draws {len(glyphs[i])} characters: with it only {count} "
                                       f"qualify, {needed} are needed"))
        else:
            kept.append(i)
    kept.sort()
    return [faces[i] for i in kept], [glyphs[i] for i in kept], left_out
