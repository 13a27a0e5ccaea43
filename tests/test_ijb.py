"""Tests for python -m sample_fc.tools.ijb on a small IJB-format set this test generates:
faces placed in larger crops at known positions (so the aligned face is known exactly),
several media per template, known genuine and impostor template pairs."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from original_models import forward
from sample_fc.tools import ijb
from test_tools import face_like, random_backbone

SIZE, DIM, IDENTITIES = 32, 16, 6


def make_release(root, seed=0):
    """An IJBC-layout folder: IDENTITIES identities x 2 templates x 2-3 media x 1-2 faces; each
    face a 32x32 image scaled x2 (nearest) into an 80x80 crop at a random offset, with the
    landmarks of the template there. Returns the faces (N, 32, 32, 3) and their metadata."""
    rng = np.random.default_rng(seed)
    (root / "loose_crop").mkdir(parents=True)
    (root / "meta").mkdir()
    faces, rows, marks, template = [], [], [], 0
    _, common = face_like(rng, SIZE)
    for identity in range(IDENTITIES):
        grid = common + rng.normal(0, 12, common.shape)     # identities close enough to be confused
        for _ in range(2):
            template += 1
            for media in range(int(rng.integers(2, 4))):
                for _ in range(int(rng.integers(1, 3))):
                    face = np.asarray(face_like(rng, SIZE, base=grid)[0])
                    crop = np.full((80, 80, 3), 128, np.uint8)
                    ox, oy = (int(v) for v in rng.integers(0, 80 - 2 * SIZE, 2))
                    crop[oy:oy + 2 * SIZE, ox:ox + 2 * SIZE] = face.repeat(2, axis=0).repeat(2, axis=1)
                    name = f"{len(faces)}.png"
                    Image.fromarray(crop).save(root / "loose_crop" / name)
                    points = 2 * ijb.TEMPLATE_112 * SIZE / 112 + 0.5 + [ox, oy]
                    faces.append(face)
                    rows.append((name, template, 100 * template + media, identity, float(rng.uniform(0.5, 1.0))))
                    marks.append(points)
    with open(root / "meta" / "ijbc_name_5pts_score.txt", "w") as handle:
        for (name, *_, score), points in zip(rows, marks):
            handle.write(" ".join([name] + [f"{v:.4f}" for v in points.ravel()] + [f"{score:.4f}"]) + "\n")
    with open(root / "meta" / "ijbc_face_tid_mid.txt", "w") as handle:
        handle.writelines(f"{name} {t} {m}\n" for name, t, m, _, _ in rows)
    owner = {t: identity for _, t, _, identity, _ in rows}
    with open(root / "meta" / "ijbc_template_pair_label.txt", "w") as handle:
        for first in range(1, template + 1):
            for second in range(first + 1, template + 1):
                handle.write(f"{first} {second} {int(owner[first] == owner[second])}\n")
    return np.stack(faces), rows


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("ijb") / "IJBC"
    faces, rows = make_release(root)
    model = tmp_path_factory.mktemp("ijb_model") / "model"
    symbol, arg_params, aux_params = random_backbone("mbf_small", DIM, SIZE)
    mx.model.save_checkpoint(str(model), 1, symbol, arg_params, aux_params)
    return root, faces, rows, model, (symbol, arg_params, aux_params)


def independent_result(faces, rows, backbone):
    """TAR at each FAR computed here without the tool: a plain MXNet forward of the faces
    (with their mirrors), the standard pooling written as loops, and every threshold tried."""
    symbol, arg_params, aux_params = backbone
    pixels = faces.transpose(0, 3, 1, 2).astype(np.float32)
    embeddings = forward(symbol, arg_params, aux_params, pixels) + \
        forward(symbol, arg_params, aux_params, pixels[:, :, :, ::-1].copy())
    media_rows = {}
    for embedding, (_, template, media, _, score) in zip(embeddings, rows):
        media_rows.setdefault(template, {}).setdefault(media, []).append(embedding * score)
    features = {}
    for template, medias in media_rows.items():
        total = sum(np.mean(members, axis=0) for members in medias.values())
        features[template] = total / np.linalg.norm(total)
    owner = {t: identity for _, t, _, identity, _ in rows}
    pairs = [(a, b) for a in sorted(features) for b in sorted(features) if a < b]
    scores = np.array([features[a] @ features[b] for a, b in pairs])
    genuine = np.array([owner[a] == owner[b] for a, b in pairs])
    table = {}
    for far in ijb.FARS:
        if far * np.sum(~genuine) < 1:          # not one impostor may be accepted: not measurable
            table[far] = None
            continue
        candidates = sorted(set(scores)) + [np.inf]
        allowed = [t for t in candidates if np.mean(scores[~genuine] > t) <= far]
        table[far] = max(np.mean(scores[genuine] > t) for t in allowed)
    return scores, table


def test_similarity_transform_recovers_a_known_similarity():
    """Test that the least-squares similarity of exact correspondences is the one that made them."""
    angle, scale, shift = 0.3, 1.7, np.array([5.0, -2.0])
    rotation = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    source = np.random.default_rng(0).uniform(0, 100, (5, 2))
    matrix = ijb.similarity_transform(source, source @ rotation.T + shift)
    np.testing.assert_allclose(matrix, np.hstack([rotation, shift[:, None]]), atol=1e-9)


def test_align_gives_back_the_face_placed_in_the_crop(release):
    """Test that aligning a crop by its landmarks returns the 32x32 face that was scaled x2 into
    it, pixel for pixel."""
    root, faces, rows, _, _ = release
    landmarks = np.loadtxt(root / "meta" / "ijbc_name_5pts_score.txt", usecols=range(1, 11)).reshape(-1, 5, 2)
    for index in (0, 7, len(faces) - 1):
        got = ijb.align(Image.open(root / "loose_crop" / rows[index][0]), landmarks[index], SIZE)
        np.testing.assert_array_equal(got, faces[index])


def test_ijb_reports_the_independently_computed_tar_at_far(release, tmp_path, capsys):
    """Test that the tool's TAR at FAR 1e-6 ... 1e-1 and its pair scores equal the ones computed
    here independently, and that it writes result.json, scores.npy and a 640x400 ROC plot."""
    root, faces, rows, model, backbone = release
    out = tmp_path / "out"
    assert ijb.main(["--model", str(model), "--root", str(root), "--out", str(out), "--batch-size", "8",
                     "--no-progress"]) == 0
    scores, table = independent_result(faces, rows, backbone)
    np.testing.assert_allclose(np.load(out / "scores.npy"), scores, atol=1e-5)
    result = json.loads((out / "result.json").read_text())
    assert result["pairs"] == len(scores) and result["templates"] == 2 * IDENTITIES
    assert result["genuine_pairs"] == IDENTITIES and result["faces"] == len(faces)
    got = {float(k): v for k, v in result["tar_at_far"].items()}
    measured = {far: tar for far, tar in table.items() if tar is not None}
    assert {far for far, tar in got.items() if tar is None} == set(table) - set(measured)
    assert {far: got[far] for far in measured} == pytest.approx(measured)
    assert 1 <= len(measured) < len(table)        # both kinds occur on this set
    assert result["smallest_far"] == pytest.approx(1 / result["impostor_pairs"])
    with Image.open(out / "roc.png") as plot:
        assert plot.size == (640, 400)
    printed = capsys.readouterr().out
    assert "output embeddings_output" in printed and "ijbc: %d faces" % len(faces) in printed
    assert f"n/a: a FAR below 1/{result['impostor_pairs']} (the impostor pairs) cannot be measured" in printed
    assert "reused" not in printed
    assert ijb.main(["--model", str(model), "--root", str(root), "--out", str(out), "--batch-size", "8",
                     "--no-progress"]) == 0          # again: every embedding from the cache, and said so
    again = capsys.readouterr().out
    assert f"reused {len(faces)} of {len(faces)} face embeddings from {out / 'cache'}" in again
    np.testing.assert_allclose(np.load(out / "scores.npy"), scores, atol=1e-5)


def test_an_interrupted_run_continues_from_its_cache(release, tmp_path, monkeypatch, capsys):
    """Test that a run stopped by an unreadable crop after its first chunk is one line naming
    the crop, and that the next run embeds only the faces after that chunk."""
    root, _, rows, model, _ = release
    monkeypatch.setattr(ijb, "CHUNK", 8)
    broken = root / "loose_crop" / rows[10][0]
    original = broken.read_bytes()
    out = tmp_path / "out"
    try:
        broken.write_bytes(b"not an image")
        with pytest.raises(SystemExit) as exit_info:
            ijb.main(["--model", str(model), "--root", str(root), "--out", str(out), "--no-progress"])
        assert exit_info.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and str(broken) in error[0], error
        assert sorted(os.listdir(out / "cache")) == ["chunk-000000.npy", "key.json"]
    finally:
        broken.write_bytes(original)
    embedded = []
    real_embedder = ijb.Embedder

    class Counting(real_embedder):
        def __call__(self, images):
            embedded.append(len(images))
            return super().__call__(images)

    monkeypatch.setattr(ijb, "Embedder", Counting)
    assert ijb.main(["--model", str(model), "--root", str(root), "--out", str(out), "--no-progress"]) == 0
    assert sum(embedded) == len(rows) - 8


def test_a_root_named_otherwise_suggests_the_target_it_holds(tmp_path, capsys):
    root = tmp_path / "my_copy"
    make_release(root, seed=2)
    with pytest.raises(SystemExit) as exit_info:
        ijb.main(["--model", str(tmp_path / "no_model_needed"), "--root", str(root), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(error) == 1, error
    assert "is named 'my_copy', but its meta/ holds the files of ijbc" in error[0] and "add --target ijbc" in error[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage,named", [
    (lambda root: (root / "meta" / "ijbc_face_tid_mid.txt").write_text("0.png 1\n"), "ijbc_face_tid_mid.txt:1"),
    (lambda root: (root / "meta" / "ijbc_template_pair_label.txt").write_text("1 2 yes\n"), "ijbc_template_pair_label.txt:1"),
    (lambda root: os.remove(root / "loose_crop" / "3.png"), os.path.join("loose_crop", "3.png")),
    (lambda root: os.remove(root / "meta" / "ijbc_name_5pts_score.txt"), "ijbc_name_5pts_score.txt: no such file"),
])
def test_damaged_release_is_one_line_naming_it(tmp_path, damage, named, capsys):
    """Test that a damaged metadata line, a missing metadata file or a missing crop ends the
    tool with one line naming it, exit 2, before the model is loaded or anything is written."""
    root = tmp_path / "IJBC"
    make_release(root, seed=1)
    damage(root)
    with pytest.raises(SystemExit) as exit_info:
        ijb.main(["--model", str(tmp_path / "no_model_needed"), "--root", str(root), "--out", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(error) == 1 and named in error[0], error
    assert not (tmp_path / "out").exists()
