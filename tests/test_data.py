"""Tests for sample_fc.data: FaceRecordIter (sharding, epochs, resume, errors) and SyntheticIter."""
import io
import re

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from sample_fc.data import FaceRecordIter, SyntheticIter

SIZE = 16


def make_image(key, rng):
    """A random 16x16 image whose first row (mirror-invariant) encodes its record key."""
    pixels = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    pixels[0] = (key % 256, key // 256, 255)
    return pixels


def png(pixels):
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def write_dataset(folder, labels, header=True, num_classes=None, label_of=float):
    """Write train.rec/.idx with mx.recordio directly, as insightface's tools do.

    With header: images at keys 1..N, identity records after them, header record 0 last.
    Without: a plain file, images at keys 0..N-1. Returns {key: (pixels, label)}.
    """
    rng = np.random.default_rng(1)
    rec = mx.recordio.MXIndexedRecordIO(str(folder / "train.idx"), str(folder / "train.rec"), "w")
    first_key = 1 if header else 0
    truth = {}
    for i, label in enumerate(labels):
        key = first_key + i
        pixels = make_image(key, rng)
        rec.write_idx(key, mx.recordio.pack(mx.recordio.IRHeader(0, label_of(label), key, 0), png(pixels)))
        truth[key] = (pixels, label)
    if header:
        start = first_key + len(labels)
        ids = sorted(set(labels))
        for j, identity in enumerate(ids):
            keys = [k for k, (_, lab) in truth.items() if lab == identity]
            identity_header = mx.recordio.IRHeader(0, (min(keys), max(keys) + 1), start + j, 0)
            rec.write_idx(start + j, mx.recordio.pack(identity_header, b""))
        rec.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(0, (start, start + len(ids)), 0, 0), b""))
    rec.close()
    if num_classes is not None:
        (folder / "property").write_text(f"{num_classes},{SIZE},{SIZE}")
    return truth


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rec")
    labels = [i // 6 for i in range(48)]  # 8 identities x 6 images
    return folder, write_dataset(folder, labels, num_classes=8)


def batch_keys(batch):
    """Record keys of a batch, read back from the first row of each image."""
    first_row = batch.data[0].asnumpy()[:, :, 0, 0].astype(np.int64)
    return list(first_row[:, 0] + 256 * first_row[:, 1])


def epoch_keys(it):
    return [k for batch in it for k in batch_keys(batch)]


def test_images_labels_and_mirrors_match_records(dataset):
    """Test that every yielded image is its record's image or its mirror, with its integer label."""
    folder, truth = dataset
    it = FaceRecordIter(str(folder / "train.rec"), batch_size=8, data_shape=(3, SIZE, SIZE), num_threads=2)
    assert (it.num_images, it.num_classes, it.num_batches) == (48, 8, 6)
    mirrored = 0
    for batch in it:
        data, labels = batch.data[0].asnumpy(), batch.label[0].asnumpy()
        assert data.dtype == np.float32 and labels.dtype == np.int64
        for key, image, label in zip(batch_keys(batch), data, labels):
            reference, reference_label = truth[key]
            hwc = image.transpose(1, 2, 0)
            flipped = np.array_equal(hwc, reference[:, ::-1])
            assert flipped or np.array_equal(hwc, reference), f"key {key} differs from its record"
            mirrored += flipped
            assert label == reference_label
    assert 0 < mirrored < 48


def test_two_ranks_disjoint_cover_and_reshuffle(dataset):
    """Test that two ranks get disjoint shards covering all images, reshuffled alike every epoch."""
    folder, truth = dataset
    ranks = [FaceRecordIter(str(folder / "train.rec"), batch_size=4, data_shape=(3, SIZE, SIZE), rank=r,
                            num_workers=2, seed=3) for r in range(2)]
    shards = []
    for epoch in range(2):
        keys = [epoch_keys(it) for it in ranks]
        assert len(keys[0]) == len(keys[1]) == 24  # 48 images / 2 ranks, 6 batches of 4 each
        assert not set(keys[0]) & set(keys[1])
        assert set(keys[0]) | set(keys[1]) == set(truth)
        shards.append(keys)
        for it in ranks:
            it.reset()
    assert set(shards[0][0]) != set(shards[1][0])  # the partition changes with the epoch
    assert shards[0][0] != sorted(shards[0][0])  # and the order is shuffled


def test_tail_dropped_so_ranks_have_equal_batches(tmp_path):
    """Test that with N not divisible by workers*batch each rank yields floor(N/W/B) batches,
    the few tail images are skipped in an epoch and show up in later epochs."""
    truth = write_dataset(tmp_path, [i % 5 for i in range(50)])
    ranks = [FaceRecordIter(str(tmp_path / "train.rec"), batch_size=4, data_shape=(3, SIZE, SIZE), rank=r,
                            num_workers=2) for r in range(2)]
    seen = set()
    for epoch in range(6):
        keys = [epoch_keys(it) for it in ranks]
        assert [len(k) for k in keys] == [24, 24]  # floor(50 / 2 / 4) = 6 batches of 4 per rank
        assert len(set(keys[0]) | set(keys[1])) == 48
        seen |= set(keys[0]) | set(keys[1])
        for it in ranks:
            it.reset()
    assert seen == set(truth)


def test_resume_gives_identical_next_batches(dataset):
    """Test that load_state_dict resumes with the same data and labels as an uninterrupted run."""
    folder, _ = dataset
    make = lambda: FaceRecordIter(str(folder / "train.rec"), batch_size=4, data_shape=(3, SIZE, SIZE),
                                  rank=1, num_workers=2, seed=5, prefetch=3)
    reference, interrupted = make(), make()
    reference.reset()  # epoch 1
    interrupted.reset()
    for _ in range(2):
        next(reference)
        next(interrupted)
    state = interrupted.state_dict()
    assert state == {"epoch": 1, "image_in_epoch": 16, "seed": 5}   # 2 global batches of 2 x 4
    interrupted.close()
    resumed = make()
    resumed.load_state_dict(state)
    batches = []
    for it in (reference, resumed):  # the rest of epoch 1 (4 batches), then all of epoch 2
        out = [next(it) for _ in range(4)]
        it.reset()
        out += list(it)
        batches.append(out)
    assert len(batches[0]) == len(batches[1]) == 4 + 6
    for a, b in zip(*batches):
        np.testing.assert_array_equal(a.data[0].asnumpy(), b.data[0].asnumpy())
        np.testing.assert_array_equal(a.label[0].asnumpy(), b.label[0].asnumpy())


def global_batches(make, world, steps):
    """The global batches (images, labels: the ranks' batches concatenated in rank order) of the
    first `steps` steps of `world` ranks made by make(rank, world)."""
    ranks = [make(r, world) for r in range(world)]
    out = []
    for _ in range(steps):
        batches = [next(it) for it in ranks]
        out.append((np.concatenate([b.data[0].asnumpy() for b in batches]),
                    np.concatenate([b.label[0].asnumpy() for b in batches])))
    for it in ranks:
        getattr(it, "close", lambda: None)()
    return out


def test_global_batch_same_for_every_world_size(dataset):
    """Test that step t's global batch of 8 is the same images, mirrors, augmentations and labels,
    in the same order, for 1 x 8, 2 x 4 and 4 x 2 workers, in this epoch and the next."""
    from sample_fc.data.augment import Augmentation
    folder, _ = dataset
    augment = Augmentation(downscale=0.5, blur=0.3, color_jitter=0.5, grayscale=0.3)

    def make(rank, world):
        it = FaceRecordIter(str(folder / "train.rec"), batch_size=8 // world, data_shape=(3, SIZE, SIZE),
                            rank=rank, num_workers=world, seed=4, augment=augment)
        it.reset()        # epoch 1: another permutation than epoch 0's
        return it
    one, two, four = (global_batches(make, world, 6) for world in (1, 2, 4))
    for (images, labels), (images2, labels2), (images4, labels4) in zip(one, two, four):
        np.testing.assert_array_equal(images, images2)
        np.testing.assert_array_equal(images, images4)
        np.testing.assert_array_equal(labels, labels2)
        np.testing.assert_array_equal(labels, labels4)
    assert len({tuple(labels) for _, labels in one}) > 1
    make_synthetic = lambda rank, world: SyntheticIter(8 // world, 1000, (3, 4, 4), seed=4, rank=rank,
                                                       num_workers=world)
    for (_, labels), (_, labels4) in zip(global_batches(make_synthetic, 1, 3), global_batches(make_synthetic, 4, 3)):
        np.testing.assert_array_equal(labels, labels4)


def test_resume_on_another_world_size_continues_the_sequence(dataset):
    """Test that a 1 x 8 position, loaded by 2 x 8 workers, yields the images a 1 x 8 run sees
    next (two of its batches per global batch of 16), through the end of the epoch."""
    folder, _ = dataset
    make = lambda rank, world: FaceRecordIter(str(folder / "train.rec"), batch_size=8, data_shape=(3, SIZE, SIZE),
                                              rank=rank, num_workers=world, seed=9)
    single = make(0, 1)
    sequence = [next(single) for _ in range(6)]       # all of epoch 0: 48 images in 6 batches
    saved = make(0, 1)
    for _ in range(2):
        next(saved)
    state = saved.state_dict()
    assert state["image_in_epoch"] == 16
    resumed = [make(r, 2) for r in range(2)]
    for it in resumed:
        it.load_state_dict(state)
    for step in range(2):               # positions 16-31, then 32-47; the epoch then ends
        for rank, it in enumerate(resumed):
            expected = sequence[2 + 2 * step + rank]
            got = next(it)
            np.testing.assert_array_equal(got.data[0].asnumpy(), expected.data[0].asnumpy())
            np.testing.assert_array_equal(got.label[0].asnumpy(), expected.label[0].asnumpy())
    with pytest.raises(StopIteration):
        next(resumed[0])


def test_resize_to_data_shape(dataset):
    """Test that images of another size are resized like Pillow's bilinear resize."""
    folder, truth = dataset
    it = FaceRecordIter(str(folder / "train.rec"), batch_size=8, data_shape=(3, 12, 10), rand_mirror=False,
                        shuffle=False)
    batch = next(it)
    assert batch.data[0].shape == (8, 3, 12, 10)
    expected = np.asarray(Image.fromarray(truth[1][0]).resize((10, 12), Image.BILINEAR))
    np.testing.assert_array_equal(batch.data[0].asnumpy()[0].transpose(1, 2, 0), expected)


def test_provide_data_and_label_match_synthetic(dataset):
    """Test that FaceRecordIter and SyntheticIter describe and yield the same names, shapes, dtypes."""
    folder, _ = dataset
    iters = [FaceRecordIter(str(folder / "train.rec"), batch_size=4, data_shape=(3, SIZE, SIZE)),
             SyntheticIter(batch_size=4, num_classes=8, data_shape=(3, SIZE, SIZE))]
    for it in iters:
        (data_desc,), (label_desc,) = it.provide_data, it.provide_label
        assert (data_desc.name, data_desc.shape) == ("data", (4, 3, SIZE, SIZE))
        assert np.dtype(data_desc.dtype) == np.float32
        assert (label_desc.name, label_desc.shape) == ("softmax_label", (4,))
        assert np.dtype(label_desc.dtype) == np.int64
        batch = next(it)
        assert batch.data[0].shape == (4, 3, SIZE, SIZE) and batch.data[0].dtype == np.float32
        assert batch.label[0].shape == (4,) and batch.label[0].dtype == np.int64


def test_synthetic_labels_large_int64_and_reproducible():
    """Test that SyntheticIter draws exact int64 labels in [0, C) for C above 2**24, reproducibly."""
    num_classes = 20_000_000
    make = lambda: SyntheticIter(batch_size=64, num_classes=num_classes, data_shape=(3, 8, 8), seed=2, rank=1,
                                 num_workers=2, num_batches=3)
    it = make()
    labels = [b.label[0].asnumpy() for b in it]
    assert len(labels) == 3 and all(l.dtype == np.int64 for l in labels)
    flat = np.concatenate(labels)
    assert flat.min() >= 0 and flat.max() < num_classes and flat.max() > 2 ** 24
    assert not np.array_equal(labels[0], labels[1])
    np.testing.assert_array_equal(next(make()).label[0].asnumpy(), labels[0])
    it.reset()
    assert not np.array_equal(next(it).label[0].asnumpy(), labels[0])  # a new epoch draws new labels


def test_plain_rec_without_header(tmp_path):
    """Test that a .rec without header record 0 is read with every indexed key as an image."""
    write_dataset(tmp_path, [3, 1, 4, 1, 5, 9, 2, 6], header=False)
    it = FaceRecordIter(str(tmp_path / "train.rec"), batch_size=8, data_shape=(3, SIZE, SIZE), shuffle=False,
                        rand_mirror=False)
    assert it.num_images == 8 and it.identity_range is None and it.num_classes is None
    batch = next(it)
    assert batch_keys(batch) == list(range(8))
    assert list(batch.label[0].asnumpy()) == [3, 1, 4, 1, 5, 9, 2, 6]


def test_array_labels_use_first_element(tmp_path):
    """Test that an image label stored as an array gives its first element as the identity."""
    write_dataset(tmp_path, [0, 1, 2, 3], label_of=lambda lab: [lab, 0.25, 7.0])
    it = FaceRecordIter(str(tmp_path / "train.rec"), batch_size=4, data_shape=(3, SIZE, SIZE), shuffle=False)
    assert list(next(it).label[0].asnumpy()) == [0, 1, 2, 3]


@pytest.mark.parametrize("bad_label, expected", [(2.5, "record key 3: label 2.5"),
                                                 (-1.0, "record key 3: label -1.0"),
                                                 (8.0, "record key 3: label 8 outside [0, 8)")])
def test_bad_labels_name_the_record(tmp_path, bad_label, expected):
    """Test that non-integer, negative and out-of-range labels raise errors naming key and value."""
    labels = [0, 1, 2, 3]
    write_dataset(tmp_path, labels, num_classes=8, label_of=lambda lab: bad_label if lab == 2 else float(lab))
    it = FaceRecordIter(str(tmp_path / "train.rec"), batch_size=4, data_shape=(3, SIZE, SIZE), shuffle=False)
    with pytest.raises(ValueError, match=re.escape(expected)):
        next(it)


def test_clear_errors_for_files_sizes_and_classes(tmp_path):
    """Test that missing files, a shard smaller than a batch and a num_classes clash name the values."""
    with pytest.raises(FileNotFoundError, match="nowhere.rec"):
        FaceRecordIter(str(tmp_path / "nowhere.rec"), batch_size=4)
    write_dataset(tmp_path, [0, 0, 1, 1, 2, 2], num_classes=3)
    (tmp_path / "train.idx").rename(tmp_path / "moved.idx")
    with pytest.raises(FileNotFoundError, match="train.idx"):
        FaceRecordIter(str(tmp_path / "train.rec"), batch_size=4)
    (tmp_path / "moved.idx").rename(tmp_path / "train.idx")
    with pytest.raises(ValueError, match="6 images over 2 workers give 3 per rank, fewer than batch_size=4"):
        FaceRecordIter(str(tmp_path / "train.rec"), batch_size=4, num_workers=2, rank=1)
    with pytest.raises(ValueError, match="num_classes=5 but .*property says 3"):
        FaceRecordIter(str(tmp_path / "train.rec"), batch_size=2, num_classes=5)
    with pytest.raises(ValueError, match="rank=2, num_workers=2"):
        FaceRecordIter(str(tmp_path / "train.rec"), batch_size=2, num_workers=2, rank=2)
    it = FaceRecordIter(str(tmp_path / "train.rec"), batch_size=2, seed=1)
    with pytest.raises(ValueError, match="seed 7, this iterator has seed 1"):
        it.load_state_dict({"epoch": 0, "image_in_epoch": 0, "seed": 7})
    with pytest.raises(ValueError, match="image 8 "):
        it.load_state_dict({"epoch": 0, "image_in_epoch": 8, "seed": 1})   # past the 6 images


def test_truncated_rec_and_swapped_paths_are_named(dataset, tmp_path):
    """Test that a .rec cut to 2/3 (its .idx points past the end) and a rec path that is the
    .idx are refused with the path and the fix, not a TypeError while reading."""
    import shutil
    folder, _ = dataset
    for name in ("train.rec", "train.idx", "property"):
        shutil.copy(folder / name, tmp_path / name)
    data = (tmp_path / "train.rec").read_bytes()
    (tmp_path / "train.rec").write_bytes(data[: 2 * len(data) // 3])
    with pytest.raises(ValueError, match="truncated"):
        FaceRecordIter(str(tmp_path / "train.rec"), 4, (3, SIZE, SIZE))
    with pytest.raises(ValueError, match="is the index; give the record file"):
        FaceRecordIter(str(tmp_path / "train.idx"), 4, (3, SIZE, SIZE))


@pytest.mark.parametrize("damage, named", [
    (lambda idx: idx[: len(idx) // 2 + 3], "line"),                           # cut inside a line
    (lambda idx: idx.replace(b"\t", b" ", 1), "line 1"),                      # no tab
    (lambda idx: b"\x93NUMPY\x01\x00" + idx, "line 1"),                       # another file's bytes first
    (lambda idx: idx + idx.splitlines(keepends=True)[0], "listed twice"),     # a key twice
], ids=["cut", "no-tab", "other-bytes", "key-twice"])
def test_a_damaged_index_is_named_with_its_line(dataset, tmp_path, damage, named):
    """Test that an .idx whose lines are not 'key<TAB>offset' (cut short, other bytes, a key
    twice) is a UsageError naming the index, not MXNet's IndexError or UnicodeDecodeError."""
    import shutil
    from sample_fc.errors import UsageError
    folder, _ = dataset
    for name in ("train.rec", "property"):
        shutil.copy(folder / name, tmp_path / name)
    (tmp_path / "train.idx").write_bytes(damage((folder / "train.idx").read_bytes()))
    with pytest.raises(UsageError, match=f"index file .*train.idx is not a RecordIO index.*{named}"):
        FaceRecordIter(str(tmp_path / "train.rec"), 4, (3, SIZE, SIZE))


def test_a_property_file_of_binary_bytes_is_named(dataset, tmp_path):
    """Test that a property file holding bytes that are not text (another file in its place) is
    a UsageError naming it, not a UnicodeDecodeError."""
    from sample_fc.data.recordio import read_property
    from sample_fc.errors import UsageError
    (tmp_path / "property").write_bytes(b"16,\x9c32,32")
    with pytest.raises(UsageError, match="property: expected 'num_classes,height,width'.*not text"):
        read_property(str(tmp_path))


@pytest.mark.parametrize("field, value", [(0, 0x12345678), (4, (1 << 29) - 1)], ids=["magic", "length"])
def test_a_record_with_damaged_framing_is_named_by_key(dataset, tmp_path, field, value):
    """Test that a record whose RecordIO magic or length word is damaged (a length past the end
    of the file) is a DataError naming the file and the key when it is read, not MXNet's
    'Invalid RecordIO File' error or an allocation of what the length says."""
    import shutil
    import struct
    from sample_fc.data.iterators import DataError
    folder, _ = dataset
    for name in ("train.rec", "train.idx", "property"):
        shutil.copy(folder / name, tmp_path / name)
    offsets = dict(line.split("\t") for line in (tmp_path / "train.idx").read_text().split("\n") if line)
    data = bytearray((tmp_path / "train.rec").read_bytes())
    struct.pack_into("<I", data, int(offsets["7"]) + field, value)
    (tmp_path / "train.rec").write_bytes(bytes(data))
    it = FaceRecordIter(str(tmp_path / "train.rec"), 48, (3, SIZE, SIZE), shuffle=False, num_threads=1)
    with pytest.raises(DataError, match=r"train.rec: record key 7 at offset \d+ is damaged"):
        next(it)


def test_a_property_file_holding_another_text_file_is_named_briefly(tmp_path):
    """Test that a property file that is a long text file (another file in its place) is named in
    a short line quoting its start, not the whole file."""
    from sample_fc.data.recordio import read_property
    from sample_fc.errors import UsageError
    (tmp_path / "property").write_text('{\n  "nodes": [\n' + '    {"op": "null", "name": "x"},\n' * 2000 + "]}")
    with pytest.raises(UsageError) as raised:
        read_property(str(tmp_path))
    message = str(raised.value)
    assert "expected 'num_classes,height,width'" in message and "bytes)" in message and len(message) < 300, \
        message[:500]
