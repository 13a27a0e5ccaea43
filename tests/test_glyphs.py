"""Tests for bench.glyphs (the glyph data set) and bench.glyph_fonts, on
the DejaVu fonts with --charset latin (Latin, Greek and Cyrillic letters as identities)."""
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from bench.glyph_fonts import (CHARSETS, FONT_PACKAGES, choose_faces, drawn_glyphs, fit_faces,
                                         list_faces, load_font, qualifying_characters)
from bench.glyphs import build_glyphs, main
from sample_fc.data import FaceRecordIter, load_bin
from sample_fc.errors import UsageError

DEJAVU = "/usr/share/fonts/truetype/dejavu"
FONTS = [f"{DEJAVU}/{name}.ttf" for name in ("DejaVuSans", "DejaVuSerif", "DejaVuSansMono", "DejaVuSans-Bold")]
SMALL = dict(identities=20, images_per_identity=4, val_identities=6, pairs=20, image_size=32, seed=1,
             fonts=FONTS, charset="latin", progress=False, log=lambda line: None)
pytestmark = pytest.mark.skipif(not all(os.path.isfile(f) for f in FONTS), reason="needs the DejaVu fonts")


def read_tsv(path):
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


@pytest.fixture(scope="module")
def glyphs(tmp_path_factory):
    out = tmp_path_factory.mktemp("glyphs")
    return out, build_glyphs(str(out), workers=1, **SMALL)


def test_training_set_reads_back_with_labels_and_size(glyphs):
    """Test that train.rec reads with FaceRecordIter: 20 identities x 4 images of 32 px, labelled in order."""
    out, summary = glyphs
    assert (out / "property").read_text() == "20,32,32"
    assert summary["images"] == 80 and summary["fonts"] == ["DejaVu Sans Book", "DejaVu Serif Book",
                                                            "DejaVu Sans Mono Book", "DejaVu Sans Bold"]
    it = FaceRecordIter(str(out / "train.rec"), batch_size=80, data_shape=(3, 32, 32), shuffle=False,
                        rand_mirror=False)
    batch = next(it)
    assert list(batch.label[0].asnumpy()) == [i // 4 for i in range(80)]
    images = batch.data[0].asnumpy()
    assert images.shape == (80, 3, 32, 32)
    assert np.array_equal(images[:, 0], images[:, 2])          # grey, stored as 3 channels
    first = images[:4, 0].reshape(4, -1)                         # one identity's captures all differ
    assert all(np.abs(first[i] - first[j]).mean() > 5 for i in range(4) for j in range(i))


def test_train_and_held_out_characters_are_disjoint(glyphs):
    """Test that characters.tsv lists 20 training and 6 held-out characters, none in both."""
    out, _ = glyphs
    rows = read_tsv(out / "characters.tsv")
    train = [r["char"] for r in rows if r["split"] == "train"]
    held_out = [r["char"] for r in rows if r["split"] == "val"]
    assert [int(r["label"]) for r in rows if r["split"] == "train"] == list(range(20))
    assert len(set(train)) == 20 and len(set(held_out)) == 6 and not set(train) & set(held_out)
    assert all(f"U+{ord(r['char']):04X}" == r["code"] for r in rows)


def best_match(image, candidates, font_path):
    """The candidate character whose clean drawing in the font best matches the image's ink
    (normalised correlation, best over shifts of up to 4 px)."""
    ink = 255.0 - image[:, :, 0]
    ink -= ink.mean()
    font, scores = load_font(font_path, 0, 22), []
    for char in candidates:
        clean = Image.new("L", (32, 32))
        ImageDraw.Draw(clean).text((16, 16), char, font=font, fill=255, anchor="mm")
        template = np.asarray(clean, np.float64)
        best = -1.0
        for dy in range(-4, 5):
            for dx in range(-4, 5):
                moved = np.roll(template, (dy, dx), axis=(0, 1))
                moved = moved - moved.mean()
                best = max(best, float((ink * moved).sum() / (np.linalg.norm(ink) * np.linalg.norm(moved) + 1e-9)))
        scores.append(best)
    return candidates[int(np.argmax(scores))]


def test_bin_pairs_are_half_same_and_show_their_characters(glyphs):
    """Test that glyphs_val.bin loads with load_bin: 20 pairs, half same; a same pair is one
    held-out character in two fonts, a different pair two characters, and each image shows its character."""
    out, _ = glyphs
    images, issame = load_bin(str(out / "glyphs_val.bin"))
    assert images.shape == (40, 32, 32, 3) and issame.sum() == 10
    pairs = read_tsv(out / "glyphs_val.tsv")
    held_out = [r["char"] for r in read_tsv(out / "characters.tsv") if r["split"] == "val"]
    fonts = {r["name"]: r["path"] for r in read_tsv(out / "fonts.tsv")}
    assert [bool(int(p["same"])) for p in pairs] == list(issame)
    matched = 0
    for i, pair in enumerate(pairs):
        assert (pair["char1"] == pair["char2"]) == issame[i]
        assert pair["font1"] != pair["font2"] or not issame[i]
        for side in (1, 2):
            assert pair[f"char{side}"] in held_out
            matched += best_match(images[2 * i + side - 1], held_out, fonts[pair[f"font{side}"]]) == pair[f"char{side}"]
    assert matched >= 36, f"{matched} of 40 images look most like their listed character"


def test_same_seed_same_bytes_whatever_the_workers(glyphs, tmp_path):
    """Test that the same seed gives byte-identical files with 2 worker processes, and another seed other images."""
    out, _ = glyphs
    build_glyphs(str(tmp_path / "again"), workers=2, **SMALL)
    build_glyphs(str(tmp_path / "other"), workers=1, **dict(SMALL, seed=2))
    for name in ("train.rec", "train.idx", "property", "glyphs_val.bin", "glyphs_val.tsv", "characters.tsv"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    assert (tmp_path / "other" / "train.rec").read_bytes() != (out / "train.rec").read_bytes()


def test_a_font_lacking_a_character_is_not_used_for_it(glyphs):
    """Test that a character some chosen font does not draw (its .notdef box) never qualifies."""
    out, _ = glyphs
    faces = list_faces(FONTS)
    glyphs_by_face = [drawn_glyphs(face, CHARSETS["latin"][0]) for face in faces]
    sans, mono = glyphs_by_face[0], glyphs_by_face[2]
    lacking = set(sans) - set(mono)
    assert len(lacking) > 50                      # DejaVu Sans Mono lacks many of Sans's letters
    assert not set(drawn_glyphs(faces[0], [0x4E00, 0x0378]))   # no CJK, nothing unassigned
    qualifying, _ = qualifying_characters(glyphs_by_face)
    assert not lacking & set(qualifying)
    used = {ord(r["char"]) for r in read_tsv(out / "characters.tsv")}
    assert used <= set(qualifying)


def test_lookalikes_and_twin_fonts_count_once(tmp_path):
    """Test that Latin A, Greek Alpha and Cyrillic A are one identity, and a copy of a font is a twin."""
    faces = list_faces([FONTS[0]])
    glyphs_by_face = [drawn_glyphs(face, [0x41, 0x391, 0x410, 0x42]) for face in faces]
    assert qualifying_characters(glyphs_by_face) == ([0x41, 0x42], 2)
    shutil.copy(FONTS[0], tmp_path / "copy.ttf")
    kept, skipped = choose_faces(list_faces([FONTS[0], FONTS[0], str(tmp_path / "copy.ttf"), FONTS[1]]), "latin")
    assert [face.name for face in kept] == ["DejaVu Sans Book", "DejaVu Serif Book"]
    assert [why for _, why in skipped] == ["draws like DejaVu Sans Book"]


def test_found_fonts_that_would_leave_too_few_characters_are_left_out():
    """Test that of fonts found (not chosen), one whose characters would bring the qualifying
    ones under the number needed is left out, naming the counts; the others keep their order."""
    glyphs_by_face = [{c: bytes([c, k]) for c in codes} for k, codes in
                      enumerate([range(100), range(10, 30), range(95), range(5, 90)])]
    kept, kept_glyphs, left_out = fit_faces(["f100", "f20", "f95", "f85"], glyphs_by_face, 50)
    assert kept == ["f100", "f95", "f85"] and kept_glyphs == [glyphs_by_face[i] for i in (0, 2, 3)]
    assert left_out == [("f20", "draws 20 characters: with it only 20 qualify, 50 are needed")]


def test_too_few_characters_or_fonts_is_one_line(tmp_path, capsys):
    """Test that too few qualifying characters, or fewer than 2 fonts with the charset, end
    with one line naming the counts, or the Debian packages to install."""
    with pytest.raises(UsageError) as err:
        build_glyphs(str(tmp_path / "many"), workers=1, **dict(SMALL, identities=1000))
    assert re.fullmatch(r"only \d+ characters are drawn by all 4 fonts; --identities 1000 \+ "
                        r"--val-identities 6 need 1006", str(err.value))
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "cjk"), "--fonts", DEJAVU, "--identities", "10"])
    message = capsys.readouterr().err
    assert exit_.value.code == 2 and message.count("\n") == 1
    assert "found 0 usable font(s) for --charset cjk" in message and "scripts/install_glyph_fonts.sh" in message
    assert all(package in message for package in FONT_PACKAGES)
    assert not (tmp_path / "many").exists() and not (tmp_path / "cjk").exists()


def test_install_script_installs_the_named_packages():
    """Test that scripts/install_glyph_fonts.sh installs exactly the packages the tool names."""
    script = (Path(__file__).resolve().parents[1] / "scripts" / "install_glyph_fonts.sh").read_text()
    listed = " ".join(re.findall(r"PACKAGES\+?=\"([^\"]+)\"", script)).split()   # PACKAGES="..." and PACKAGES+="..."
    assert listed == list(FONT_PACKAGES)
