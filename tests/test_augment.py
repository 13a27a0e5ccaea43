"""Tests for sample_fc.data.augment: the four ops against NumPy/Pillow formulas, probabilities,
and FaceRecordIter's augmented batches (off = unchanged, deterministic, resumable)."""
import numpy as np
import pytest
from PIL import Image, ImageFilter

import default
from sample_fc.config import apply_overrides
from sample_fc.data import FaceRecordIter
from sample_fc.data.augment import PARAMS, Augmentation, augment_image
from sample_fc.data.images import encode_jpeg
from sample_fc.data.recordio import RecordWriter

SIZE = 16
OPS = ("downscale", "blur", "color_jitter", "grayscale")


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """A .rec of 200 noisy 16x16 colour JPEGs, 10 identities x 20 images."""
    folder = tmp_path_factory.mktemp("aug")
    rng = np.random.default_rng(0)
    with RecordWriter(str(folder / "train"), SIZE) as writer:
        for _ in range(10):
            writer.add_identity(encode_jpeg(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8))
                                for _ in range(20))
        writer.finish()
    return str(folder / "train.rec")


def make_iter(rec, augment=None, **kwargs):
    return FaceRecordIter(rec, batch_size=8, data_shape=(3, SIZE, SIZE), seed=4, augment=augment, **kwargs)


def epoch_data(it):
    """The images of the iterator's current epoch, (N, 3, H, W) float32."""
    return np.concatenate([batch.data[0].asnumpy() for batch in it])


def params(downscale=None, radius=None, factors=None, grayscale=False):
    """One PARAMS row applying exactly the ops given values."""
    row = np.zeros(1, dtype=PARAMS)[0]
    row["downscale"], row["fraction"] = downscale is not None, downscale or 0.0
    row["blur"], row["radius"] = radius is not None, radius or 0.0
    row["jitter"], row["factors"] = factors is not None, factors or (1.0, 1.0, 1.0)
    row["grayscale"] = grayscale
    return row


def test_probability_zero_leaves_batches_byte_identical(rec):
    """Test that all-zero probabilities yield exactly the batches of an iterator without augment,
    and that a drawn row applying no op returns its input unchanged."""
    for epoch in range(2):
        plain, zero = make_iter(rec), make_iter(rec, Augmentation())
        for it in (plain, zero):
            for _ in range(epoch):
                it.reset()
        np.testing.assert_array_equal(epoch_data(plain), epoch_data(zero))
    pixels = np.random.default_rng(1).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    rows = Augmentation().draw(np.random.default_rng(2), 5)
    assert all(augment_image(pixels, row) is pixels for row in rows)


def test_grayscale_is_the_rounded_601_luma():
    """Test that grayscale gives 0.299 R + 0.587 G + 0.114 B, rounded, in all three channels."""
    pixels = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255]],
                       [[10, 20, 30], [200, 100, 50], [0, 0, 0], [128, 64, 32]]], dtype=np.uint8)
    out = augment_image(pixels, params(grayscale=True))
    assert out.dtype == np.uint8 and out.shape == pixels.shape
    assert (out == out[..., :1]).all()
    np.testing.assert_array_equal(out[..., 0], [[76, 150, 29, 255], [18, 124, 0, 79]])
    noise = np.random.default_rng(3).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    luma = 0.299 * noise[..., 0] + 0.587 * noise[..., 1] + 0.114 * noise[..., 2]
    assert np.abs(augment_image(noise, params(grayscale=True))[..., 0] - luma).max() <= 0.5 + 1e-9


def test_color_jitter_matches_brightness_contrast_saturation_formula():
    """Test that jitter scales brightness, blends with the mean gray (contrast) and with each
    pixel's gray (saturation), rounded and clipped, against a per-channel NumPy formula."""
    pixels = np.random.default_rng(4).integers(0, 256, (6, 5, 3), dtype=np.uint8)
    brightness, contrast, saturation = 1.15, 0.85, 1.2
    r, g, b = (pixels[..., c] * brightness for c in range(3))
    mean = (0.299 * r + 0.587 * g + 0.114 * b).mean()
    r, g, b = (mean + contrast * (x - mean) for x in (r, g, b))
    gray = 0.299 * r + 0.587 * g + 0.114 * b
    expected = np.stack([gray + saturation * (x - gray) for x in (r, g, b)], axis=-1)
    expected = np.clip(np.round(expected), 0, 255)
    out = augment_image(pixels, params(factors=(brightness, contrast, saturation)))
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected)
    assert (out == 255).any()  # the brightness factor pushed some values past 255: clipped
    np.testing.assert_array_equal(augment_image(pixels, params(factors=(1.0, 1.0, 1.0))), pixels)


@pytest.mark.parametrize("fraction, small", [(0.5, (8, 6)), (0.75, (12, 9)), (0.99, (15, 11))])
def test_downscale_is_a_bilinear_resize_pair(fraction, small):
    """Test that downscale shrinks to floor(fraction * side) and back, both with Pillow bilinear."""
    pixels = np.random.default_rng(5).integers(0, 256, (12, 16, 3), dtype=np.uint8)  # H 12, W 16
    expected = Image.fromarray(pixels).resize(small, Image.BILINEAR).resize((16, 12), Image.BILINEAR)
    out = augment_image(pixels, params(downscale=fraction))
    np.testing.assert_array_equal(out, np.asarray(expected))
    assert not np.array_equal(out, pixels)


def test_blur_is_pillows_gaussian_blur_keeping_brightness():
    """Test that blur equals Pillow's GaussianBlur, changes the image and keeps its mean within 2%."""
    pixels = np.random.default_rng(6).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    out = augment_image(pixels, params(radius=1.2))
    np.testing.assert_array_equal(out, np.asarray(Image.fromarray(pixels).filter(ImageFilter.GaussianBlur(1.2))))
    assert not np.array_equal(out, pixels)
    assert abs(out.mean() - pixels.mean()) < 0.02 * pixels.mean()


def test_draw_ranges_and_order_of_ops():
    """Test that drawn values stay in their ranges and ops apply in the order downscale, blur,
    jitter, grayscale."""
    rows = Augmentation(1.0, 1.0, 1.0, 1.0).draw(np.random.default_rng(7), 500)
    assert rows["downscale"].all() and rows["blur"].all() and rows["jitter"].all() and rows["grayscale"].all()
    assert 0.5 <= rows["fraction"].min() and rows["fraction"].max() < 1.0
    assert 0.5 <= rows["radius"].min() and rows["radius"].max() <= 1.5
    assert 0.8 <= rows["factors"].min() and rows["factors"].max() <= 1.2
    pixels = np.random.default_rng(8).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    step = pixels
    for single in (params(downscale=rows[0]["fraction"]), params(radius=rows[0]["radius"]),
                   params(factors=tuple(rows[0]["factors"])), params(grayscale=True)):
        step = augment_image(step, single)
    np.testing.assert_array_equal(augment_image(pixels, rows[0]), step)


@pytest.mark.parametrize("op", OPS)
def test_probability_one_changes_every_image_and_half_changes_about_half(rec, op):
    """Test that probability 1 changes all 200 images of an epoch and 0.5 changes 35-65% of them."""
    plain = epoch_data(make_iter(rec))
    changed = lambda data: np.mean([not np.array_equal(a, b) for a, b in zip(data, plain)])
    assert changed(epoch_data(make_iter(rec, Augmentation(**{op: 1.0})))) == 1.0
    assert 0.35 <= changed(epoch_data(make_iter(rec, Augmentation(**{op: 0.5})))) <= 0.65


def test_augmented_batches_are_deterministic_across_threads_and_resume(rec):
    """Test that (seed, epoch, rank) fixes the augmented images: the same twice, with 1 or 3
    decode threads, after load_state_dict mid-epoch; another epoch or rank differs."""
    augment = Augmentation(downscale=0.5, blur=0.5, color_jitter=0.5, grayscale=0.3)
    first = make_iter(rec, augment, num_threads=3, prefetch=3)
    first.reset()  # epoch 1
    reference = epoch_data(first)
    again = make_iter(rec, augment, num_threads=1)
    again.reset()
    np.testing.assert_array_equal(epoch_data(again), reference)

    interrupted = make_iter(rec, augment, num_threads=3)
    interrupted.reset()
    head = [next(interrupted).data[0].asnumpy() for _ in range(7)]
    state = interrupted.state_dict()
    interrupted.close()
    resumed = make_iter(rec, augment, num_threads=2)
    resumed.load_state_dict(state)
    np.testing.assert_array_equal(np.concatenate(head + [epoch_data(resumed)]), reference)

    other_epoch = make_iter(rec, augment)
    assert not np.array_equal(epoch_data(other_epoch), reference)  # epoch 0
    other_rank = make_iter(rec, augment, rank=1, num_workers=2)
    other_rank.reset()
    plain_rank = make_iter(rec, rank=1, num_workers=2)
    plain_rank.reset()
    assert not np.array_equal(epoch_data(other_rank), epoch_data(plain_rank))


@pytest.mark.parametrize("value", [1.5, -0.1, "x", float("nan"), True])
def test_bad_probability_names_the_key(value):
    """Test that a probability outside [0, 1], or not a number, is a ValueError naming the key."""
    with pytest.raises(ValueError, match=r"aug_blur must be a probability in \[0, 1\], got"):
        Augmentation(blur=value)


@pytest.mark.parametrize("override, key", [("aug_blur=1.5", "aug_blur"), ("aug_downscale=-0.1", "aug_downscale"),
                                           ("aug_color_jitter=nan", "aug_color_jitter"),
                                           ("aug_grayscale=2", "aug_grayscale")])
def test_check_config_rejects_bad_probabilities(override, key):
    """Test that an aug_* key outside [0, 1] is refused naming the key, its value and the range."""
    with pytest.raises(ValueError) as info:
        default.config_for_run(overrides=[override])
    assert str(info.value).startswith(f"config key {key!r} is {override.split('=')[1]!r}; expected ")
    assert "in [0, 1]" in str(info.value)


def test_config_defaults_off_and_mutable_on_resume():
    """Test that the aug_* keys default to 0.0 (off) and may change on resume."""
    cfg = default.get_config()
    for op in OPS:
        assert cfg[f"aug_{op}"] == 0.0 and isinstance(cfg[f"aug_{op}"], float)
        assert f"aug_{op}" in default.RESUME_MUTABLE


def test_builder_passes_the_config_probabilities(rec):
    """Test that build_iterator gives FaceRecordIter the Augmentation of the aug_* keys."""
    from sample_fc.builder import build_iterator
    cfg = apply_overrides(default.get_config(), [f"rec={rec}", "num_classes=10", f"image_size={SIZE}",
                                                 "batch_size=8", "aug_blur=0.25", "aug_grayscale=1"], default.KEYS)
    it = build_iterator(cfg, 0, 1)
    assert it.augment == Augmentation(blur=0.25, grayscale=1.0)
    it.close()
    with pytest.raises(ValueError, match="augment must be None or an Augmentation"):
        make_iter(rec, {"blur": 0.5})
