"""Tests for sample_fc.tools.demo_data (synthetic faces) and sample_fc.data.bin_format (verification .bin)."""
import io
import pickle
import struct

import numpy as np
import pytest
from PIL import Image

from sample_fc.data.bin_format import load_bin, write_bin
from sample_fc.data import FaceRecordIter
from sample_fc.tools.demo_data import TRAIN, VAL, identity_template, main, make_demo, raw_pixel_accuracy

SMALL = dict(num_identities=6, images_per_identity=4, num_val_identities=4, num_pairs=10, image_size=48,
             progress=False)
FILES = ["train.rec", "train.idx", "property", "demo_val.bin"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    return out, make_demo(str(out), seed=0, **SMALL)


def test_same_seed_same_bytes_other_seed_other_bytes(demo, tmp_path):
    """Test that the demo is byte-identical for the same seed and different for another seed."""
    out, _ = demo
    make_demo(str(tmp_path / "again"), seed=0, **SMALL)
    make_demo(str(tmp_path / "other"), seed=1, **SMALL)
    for name in FILES:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    for name in ["train.rec", "demo_val.bin"]:
        assert (tmp_path / "other" / name).read_bytes() != (out / name).read_bytes(), name


def test_bin_is_insightface_pickle(demo):
    """Test that demo_val.bin unpickles with encoding='bytes' into (encoded images, issame bools)."""
    out, summary = demo
    with open(out / "demo_val.bin", "rb") as f:
        bins, issame = pickle.load(f, encoding="bytes")
    assert len(bins) == 2 * len(issame) == 20
    assert all(isinstance(b, bytes) for b in bins) and all(type(x) is bool for x in issame)
    assert sum(issame) == 5  # half same-identity pairs
    for encoded in bins:
        image = Image.open(io.BytesIO(encoded))
        assert image.format == "JPEG" and image.size == (48, 48) and image.mode == "RGB"
    images, flags = load_bin(str(out / "demo_val.bin"))
    assert images.shape == (20, 48, 48, 3) and images.dtype == np.uint8 and flags.dtype == np.bool_
    for i in np.nonzero(flags)[0]:  # a same-identity pair shows two different views
        assert not np.array_equal(images[2 * i], images[2 * i + 1])
    assert 0.0 <= summary["raw_pixel_accuracy"] <= 1.0


def test_training_set_readable_and_val_identities_held_out(demo):
    """Test that train.rec reads with FaceRecordIter and verification identities are not training ones."""
    out, summary = demo
    assert (out / "property").read_text() == "6,48,48"
    it = FaceRecordIter(str(out / "train.rec"), batch_size=24, data_shape=(3, 48, 48), shuffle=False,
                        rand_mirror=False)
    labels = next(it).label[0].asnumpy()
    assert list(labels) == [i // 4 for i in range(24)]
    train = [identity_template(0, TRAIN, k) for k in range(6)]
    held_out = [identity_template(0, VAL, v) for v in summary["val_identities"]]
    assert len(held_out) >= 2
    look = lambda t: (tuple(np.round(t["skin"], 6)), t["face_a"], t["eye_dx"], t["mouth_w"])
    assert not {look(t) for t in held_out} & {look(t) for t in train}
    val_images, _ = load_bin(str(out / "demo_val.bin"))
    it.reset()
    train_images = next(it).data[0].asnumpy().transpose(0, 2, 3, 1)
    for image in val_images:  # no verification image is a training image
        assert np.abs(train_images - image).reshape(24, -1).mean(axis=1).min() > 10


def test_raw_pixel_baseline_is_weak(tmp_path, capsys):
    """Test that cosine similarity on raw pixels verifies the demo pairs only modestly (0.5-0.8)."""
    main(["--out", str(tmp_path), "--num-identities", "2", "--images-per-identity", "2",
          "--num-val-identities", "40", "--num-pairs", "200", "--image-size", "64"])
    printed = capsys.readouterr().out
    accuracy = raw_pixel_accuracy(str(tmp_path / "demo_val.bin"))
    assert f"raw-pixel cosine baseline on demo_val.bin: {accuracy:.4f}" in printed
    assert 0.5 <= accuracy <= 0.8


def test_load_bin_reads_python2_pickles(tmp_path):
    """Test that load_bin reads a protocol-2 pickle of Python 2 str images (needs encoding='bytes')."""
    images = [np.full((8, 8, 3), 40 * i, dtype=np.uint8) for i in range(4)]
    encoded = []
    for pixels in images:
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        encoded.append(buf.getvalue())
    # Hand-written opcodes, as Python 2 writes them: BINSTRING for str, NEWTRUE/NEWFALSE, TUPLE2.
    body = b"]q\x00(" + b"".join(b"T" + struct.pack("<I", len(e)) + e for e in encoded) + b"e"
    body += b"]q\x01(\x88\x89e\x86q\x02."
    (tmp_path / "py2.bin").write_bytes(b"\x80\x02" + body)
    with pytest.raises(UnicodeDecodeError):
        pickle.loads(b"\x80\x02" + body)  # what a plain Python 3 load does
    loaded, issame = load_bin(str(tmp_path / "py2.bin"))
    np.testing.assert_array_equal(loaded, np.stack(images))
    assert list(issame) == [True, False]
    resized, _ = load_bin(str(tmp_path / "py2.bin"), image_size=4)
    assert resized.shape == (4, 4, 4, 3)


def test_write_bin_checks_pairs(tmp_path):
    """Test that write_bin refuses an image count that is not twice the pair count, naming both."""
    with pytest.raises(ValueError, match="3 images for 2 pairs; expected 4"):
        write_bin(str(tmp_path / "x.bin"), [b"a", b"b", b"c"], [True, False])
