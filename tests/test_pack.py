"""Tests for sample_fc.tools.pack: folder -> insightface .rec/.idx/property, checked with mx.recordio."""
import io

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from sample_fc.data import FaceRecordIter
from sample_fc.errors import UsageError
from sample_fc.tools.pack import main, pack_folder

NAMES = ["alice", "bob", "carol"]  # sorted -> ids 0, 1, 2


def smooth_image(seed, size=32):
    """A smooth random colour image (JPEG keeps it within a few grey levels)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    amplitude, fx, fy, phase = rng.uniform([40, 1, 1, 0], [80, 4, 4, 6], size=(3, 4)).T
    channels = [128 + amplitude[c] * np.sin(fx[c] * x + fy[c] * y + phase[c]) for c in range(3)]
    return np.clip(np.stack(channels, axis=-1), 0, 255).astype(np.uint8)


def open_record(folder):
    """The packed dataset in folder, opened with mxnet.recordio directly."""
    return mx.recordio.MXIndexedRecordIO(str(folder / "train.idx"), str(folder / "train.rec"), "r")


@pytest.fixture
def image_folder(tmp_path):
    """3 identities x 4 images (PNG and JPEG, 32x32), listed in reverse to check sorting."""
    source = {}
    for ident, name in reversed(list(enumerate(NAMES))):
        (tmp_path / "images" / name).mkdir(parents=True)
        for j in range(4):
            pixels = smooth_image(10 * ident + j)
            path = tmp_path / "images" / name / f"{j}.{'png' if j % 2 else 'jpg'}"
            Image.fromarray(pixels).save(path, **({"quality": 100} if path.suffix == ".jpg" else {}))
            source[str(path)] = (np.asarray(Image.open(path).convert("RGB")), ident)
    (tmp_path / "images" / "bob" / "notes.txt").write_text("not an image")
    return tmp_path / "images", source


def test_pack_matches_insightface_layout(image_folder, tmp_path):
    """Test that packing writes header, image and identity records and property as insightface does."""
    images, source = image_folder
    summary = pack_folder(str(images), str(tmp_path / "out" / "train"), image_size=32, progress=False)
    assert (summary["num_images"], summary["num_identities"], summary["skipped"]) == (12, 3, [])
    assert (tmp_path / "out" / "property").read_text() == "3,32,32"
    rec = open_record(tmp_path / "out")
    assert sorted(rec.keys) == list(range(16))
    header, payload = mx.recordio.unpack(rec.read_idx(0))
    assert header.flag == 2 and list(header.label) == [13, 16] and payload == b""
    for identity in range(3):
        header, _ = mx.recordio.unpack(rec.read_idx(13 + identity))
        assert list(header.label) == [1 + 4 * identity, 5 + 4 * identity]
    expected = [source[p] for p in sorted(source)]  # alice/0..3, bob/0..3, carol/0..3
    for key in range(1, 13):
        header, encoded = mx.recordio.unpack(rec.read_idx(key))
        pixels, ident = expected[key - 1]
        assert header.flag == 0 and header.label == ident
        decoded = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB")).astype(int)
        assert np.abs(decoded - pixels).mean() < 1.5 and np.abs(decoded - pixels).max() < 12  # JPEG q95

    it = FaceRecordIter(str(tmp_path / "out" / "train.rec"), batch_size=12, data_shape=(3, 32, 32),
                        shuffle=False, rand_mirror=False)
    assert it.num_classes == 3 and it.num_images == 12
    batch = next(it)
    assert list(batch.label[0].asnumpy()) == [0] * 4 + [1] * 4 + [2] * 4
    for key in range(1, 13):
        _, encoded = mx.recordio.unpack(rec.read_idx(key))
        np.testing.assert_array_equal(batch.data[0].asnumpy()[key - 1].transpose(1, 2, 0),
                                      np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB")))


def test_pack_resizes_to_image_size(image_folder, tmp_path):
    """Test that images of another size are stored at image_size and property says so."""
    images, _ = image_folder
    pack_folder(str(images), str(tmp_path / "small" / "train"), image_size=20, progress=False)
    assert (tmp_path / "small" / "property").read_text() == "3,20,20"
    rec = open_record(tmp_path / "small")
    _, encoded = mx.recordio.unpack(rec.read_idx(5))
    assert Image.open(io.BytesIO(encoded)).size == (20, 20)


def test_unreadable_image_error_or_skip(image_folder, tmp_path, capsys):
    """Test that a corrupt image fails naming its path, and --skip-bad skips and reports it."""
    images, _ = image_folder
    bad = images / "bob" / "1.png"
    bad.write_bytes(b"definitely not a png")
    with pytest.raises(UsageError, match="bob/1.png"):
        pack_folder(str(images), str(tmp_path / "fail" / "train"), image_size=32, progress=False)
    assert not (tmp_path / "fail" / "train.rec").exists()  # no partial dataset left behind
    main(["--images", str(images), "--out", str(tmp_path / "skip" / "train"), "--image-size", "32",
          "--skip-bad"])
    captured = capsys.readouterr()
    assert "11 images, 3 identities" in captured.out
    assert "skipped 1 unreadable images" in captured.err and str(bad) in captured.err
    rec = open_record(tmp_path / "skip")
    header, _ = mx.recordio.unpack(rec.read_idx(0))
    assert list(header.label) == [12, 15]
    assert list(mx.recordio.unpack(rec.read_idx(13))[0].label) == [5, 8]  # bob keeps 3 images


def test_missing_or_empty_folder_errors(tmp_path):
    """Test that a missing images folder or one without identity subfolders names the path."""
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        pack_folder(str(tmp_path / "no_such_dir"), str(tmp_path / "x"), progress=False)
    (tmp_path / "flat").mkdir()
    with pytest.raises(ValueError, match="has no identity subfolders"):
        pack_folder(str(tmp_path / "flat"), str(tmp_path / "x"), progress=False)


def test_every_image_extension_is_packed(image_folder, tmp_path):
    """Test that .bmp, .webp and .tif images are packed like .jpg/.png (the one extension list
    of sample_fc.data.images; pack used to drop .bmp silently)."""
    images, _ = image_folder
    for k, extension in enumerate((".bmp", ".webp", ".tif")):
        Image.fromarray(smooth_image(100 + k)).save(images / "carol" / f"extra{k}{extension}")
    summary = pack_folder(str(images), str(tmp_path / "out" / "train"), image_size=32, progress=False)
    assert (summary["num_images"], summary["skipped"]) == (15, [])


def test_folders_without_images_are_an_error(tmp_path, capsys):
    """Test that identity folders holding no image file stop pack with one line and exit 2,
    instead of writing an empty dataset."""
    for name in ("a", "b"):
        (tmp_path / "images" / name).mkdir(parents=True)
        (tmp_path / "images" / name / "readme.txt").write_text("no images here")
    with pytest.raises(SystemExit) as stop:
        main(["--images", str(tmp_path / "images"), "--out", str(tmp_path / "out" / "train")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hold no image files" in err
    assert not (tmp_path / "out").exists()


def test_lossless_pack_reads_back_the_exact_pixels(image_folder, tmp_path):
    """Test that --lossless stores PNG, so FaceRecordIter yields exactly the source pixels,
    which the JPEG path (quality 95) does not."""
    images, source = image_folder
    main(["--images", str(images), "--out", str(tmp_path / "png" / "train"), "--image-size", "32", "--lossless"])
    pack_folder(str(images), str(tmp_path / "jpeg" / "train"), image_size=32, progress=False)
    expected = [source[p][0] for p in sorted(source)]
    yielded = {}
    for kind in ("png", "jpeg"):
        it = FaceRecordIter(str(tmp_path / kind / "train.rec"), batch_size=12, data_shape=(3, 32, 32),
                            shuffle=False, rand_mirror=False)
        yielded[kind] = next(it).data[0].asnumpy().transpose(0, 2, 3, 1)
        it.close()
    _, encoded = mx.recordio.unpack(open_record(tmp_path / "png").read_idx(1))
    assert encoded.startswith(b"\x89PNG")
    np.testing.assert_array_equal(yielded["png"], np.stack(expected))
    assert not any(np.array_equal(a, b) for a, b in zip(yielded["jpeg"], expected))


def test_lossless_with_a_jpeg_quality_is_an_argument_error(image_folder, tmp_path, capsys):
    """Test that --lossless with a --quality other than the default stops with one error line and
    exit 2 (quality is JPEG-only), writing nothing; pack_folder refuses it too."""
    images, _ = image_folder
    with pytest.raises(SystemExit) as stop:
        main(["--images", str(images), "--out", str(tmp_path / "out" / "train"), "--lossless", "--quality", "80"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1].endswith("error: --quality 80 applies to JPEG only; drop it or --lossless")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="quality=80 applies to JPEG only"):
        pack_folder(str(images), str(tmp_path / "out" / "train"), quality=80, lossless=True, progress=False)


def test_a_jpeg_whose_header_claims_billions_of_pixels_is_an_unreadable_image(image_folder, tmp_path, capsys):
    """Test that a JPEG whose frame header (SOF0) is damaged to say 65000 x 65000 pixels fails
    naming its path (Pillow's DecompressionBombError is not an OSError: it was a traceback), and
    --skip-bad skips it as any undecodable image."""
    import struct
    images, _ = image_folder
    bad = images / "bob" / "0.jpg"
    data = bytearray(bad.read_bytes())
    frame = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, frame + 5, 65000, 65000)
    bad.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=r"bob/0.jpg: cannot decode image: its header says image size "
                                         r"\(4225000000 pixels\).*damaged"):
        pack_folder(str(images), str(tmp_path / "fail" / "train"), image_size=32, progress=False)
    main(["--images", str(images), "--out", str(tmp_path / "skip" / "train"), "--image-size", "32", "--skip-bad"])
    assert "skipped 1 unreadable images" in capsys.readouterr().err


def test_a_failed_pack_over_an_existing_set_leaves_it_as_it_was(image_folder, tmp_path):
    """Test that packing into a folder that holds a set, stopped by an unreadable image after
    whole identities were written, leaves the old train.rec, train.idx and property byte for
    byte and no partial files; a pack that completes replaces the set."""
    images, _ = image_folder
    out = tmp_path / "set"
    pack_folder(str(images), str(out / "train"), image_size=32, progress=False)
    before = {name: (out / name).read_bytes() for name in ("train.rec", "train.idx", "property")}
    (images / "carol" / "3.png").write_bytes(b"not an image")            # the last identity's
    with pytest.raises(UsageError, match="carol/3.png"):
        pack_folder(str(images), str(out / "train"), image_size=16, progress=False)
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["property", "train.idx", "train.rec"]
    (images / "carol" / "3.png").unlink()
    pack_folder(str(images), str(out / "train"), image_size=16, progress=False)
    assert (out / "property").read_text().strip() == "3,16,16"
    header, _ = mx.recordio.unpack(open_record(out).read_idx(0))
    assert list(header.label) == [12, 15]                               # 11 images now, 3 identities
    assert sorted(p.name for p in out.iterdir()) == ["property", "train.idx", "train.rec"]
