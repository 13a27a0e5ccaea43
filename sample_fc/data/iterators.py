"""Training iterators: FaceRecordIter (insightface RecordIO) and SyntheticIter (benchmarks).

Both yield mx.io.DataBatch with data=[(B, 3, H, W) RGB, raw pixel values 0..255 as float32
(or float16 with dtype='float16'); the backbone normalises] and label=[(B,) int64
identities], B being the per-rank batch, under the names 'data' and 'softmax_label'.
Arrays are on the CPU; the module copies them to its context. Epochs are explicit: the
iterator starts in epoch 0 and every `reset()` moves to the next epoch (Module.fit calls it
at the end of each epoch; calling it before the first batch skips epoch 0).
`state_dict()` / `load_state_dict()` resume at the next batch with the same images, labels,
mirrors and augmentations.
"""
import collections
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import mxnet as mx
import numpy as np

from ..errors import UsageError
from .augment import Augmentation, augment_image
from .images import decode_rgb
from .recordio import RecordFrames, label_to_int, open_record, read_property, read_record

DTYPES = ("float32", "float16")
DATA_STATE_KEYS = ("epoch", "image_in_epoch", "seed")   # state_dict(): one owner of its keys
PER_IMAGE_BLOCK = 4096    # positions per generator of the per-image draws (mirrors, augmentation, labels)


class DataError(UsageError):
    """A training record that cannot be used: unreadable, a bad label, an undecodable image.
    Raised by FaceRecordIter.next(); the message names the file and the record key."""


def _positive_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1


def _check_common(batch_size, data_shape, dtype, seed):
    if not _positive_int(batch_size):
        raise UsageError(f"batch_size must be a positive integer, got {batch_size!r}")
    shape = tuple(data_shape)
    if len(shape) != 3 or shape[0] != 3 or not all(_positive_int(x) for x in shape):
        raise UsageError(f"data_shape must be (3, height, width) with positive sizes, got {data_shape!r}")
    try:
        name = str(np.dtype(dtype))
    except TypeError:
        name = None
    if name not in DTYPES:
        raise UsageError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not (isinstance(seed, (int, np.integer)) and seed >= 0):
        raise UsageError(f"seed must be a non-negative integer, got {seed!r}")
    return tuple(int(x) for x in shape), name


class _EpochIter(mx.io.DataIter):
    """Shared shapes, the rank's place in the global batch, epoch bookkeeping and state."""

    def __init__(self, batch_size, data_shape, dtype, seed, rank, num_workers):
        super().__init__(batch_size)
        self.data_shape, self.dtype = _check_common(batch_size, data_shape, dtype, seed)
        if not (_positive_int(num_workers) and isinstance(rank, (int, np.integer))
                and 0 <= rank < num_workers):
            raise UsageError(f"need 0 <= rank < num_workers, got rank={rank!r}, "
                             f"num_workers={num_workers!r}")
        self.seed, self.rank, self.num_workers = int(seed), int(rank), int(num_workers)
        self.global_batch = self.num_workers * self.batch_size
        self.epoch, self.image_in_epoch = 0, 0

    @property
    def provide_data(self):
        return [mx.io.DataDesc("data", (self.batch_size,) + self.data_shape, dtype=np.dtype(self.dtype))]

    @property
    def provide_label(self):
        return [mx.io.DataDesc("softmax_label", (self.batch_size,), dtype=np.int64)]

    def _batch(self, data, labels):
        return mx.io.DataBatch(data=[data], label=[mx.nd.array(labels, dtype=np.int64)], pad=0,
                               provide_data=self.provide_data, provide_label=self.provide_label)

    def _per_image(self, stream, draw, lo, hi):
        """Rows lo..hi (positions in the epoch's sequence of images) of draw(rng, n), drawn in
        blocks of PER_IMAGE_BLOCK positions from default_rng((seed, epoch, stream, block)):
        an image's draw depends on its position only, not on the world size."""
        first, last = lo // PER_IMAGE_BLOCK, (hi - 1) // PER_IMAGE_BLOCK
        rows = [draw(np.random.default_rng((self.seed, self.epoch, stream, block)), PER_IMAGE_BLOCK)
                for block in range(first, last + 1)]
        start = first * PER_IMAGE_BLOCK
        return np.concatenate(rows)[lo - start:hi - start]

    def _own_slice(self, start):
        """Positions [lo, hi) of this rank's images in the global batch starting at `start`."""
        lo = start + self.rank * self.batch_size
        return lo, lo + self.batch_size

    def reset(self):
        """Move to the next epoch (a new shuffle and new mirrors)."""
        self._start_epoch(self.epoch + 1, 0)

    def state_dict(self):
        """Where the iterator is: {'epoch', 'image_in_epoch' (position in the epoch's sequence of
        the next global batch's first image), 'seed'}."""
        return {"epoch": self.epoch, "image_in_epoch": self.image_in_epoch, "seed": self.seed}

    def load_state_dict(self, state):
        """Resume so that the next global batch starts at image `state['image_in_epoch']` of
        `state['epoch']`, whatever the world size it was saved with."""
        if set(state) != set(DATA_STATE_KEYS):
            raise UsageError(f"state must have keys {', '.join(DATA_STATE_KEYS)}; got {sorted(state)}")
        if state["seed"] != self.seed:
            raise UsageError(f"state was saved with seed {state['seed']}, "
                             f"this iterator has seed {self.seed}")
        epoch, image = int(state["epoch"]), int(state["image_in_epoch"])
        last = self._images_per_epoch()
        if epoch < 0 or image < 0 or (last is not None and image > last):
            raise UsageError(f"cannot resume at epoch {epoch}, image {image} (images per epoch: {last})")
        self._start_epoch(epoch, image)

    def _images_per_epoch(self):
        return None


class FaceRecordIter(_EpochIter):
    """Sharded, shuffled, prefetching reader of an insightface .rec/.idx dataset.

    Every epoch the image keys (sorted) are permuted with np.random.default_rng((seed, epoch)),
    identically on all ranks, and read as global batches of G = num_workers * batch_size
    images: global batch k of the epoch is positions [k * G, (k + 1) * G) of the permutation,
    and rank r takes its slice [k * G + r * batch_size, k * G + (r + 1) * batch_size). So the
    images of a global step are the same for 1, 2, 4 or 8 workers (their order in it too),
    every rank yields the same number of batches, num_images // G per epoch, and the
    num_images - num_batches * G tail images are skipped this epoch and, thanks to
    reshuffling, seen in later ones (with shuffle=False the same tail is skipped every epoch).
    Each image's horizontal mirror and augmentation parameters are drawn per position in the
    epoch's permutation (PER_IMAGE_BLOCK positions per generator, seeded (seed, epoch, stream,
    block)), so they too are the same whatever the world size and the thread scheduling.
    Images are decoded with Pillow by `num_threads` threads, `prefetch` batches ahead, and
    resized (bilinear) when their size differs from data_shape; `augment` (an Augmentation;
    None = none) changes them before the mirror. Labels are checked to be integers in
    [0, num_classes) as they are read; num_classes defaults to the one in `property`, which
    must agree if both exist.

    The position is counted in images (`state_dict()['image_in_epoch']`, the next global
    batch's first position), so a run resumed on another world size (another G) continues
    the same sequence of images from where it stopped.
    """

    def __init__(self, path_imgrec, batch_size, data_shape=(3, 112, 112), rank=0, num_workers=1,
                 shuffle=True, rand_mirror=True, seed=0, num_threads=2, prefetch=2, dtype="float32",
                 num_classes=None, path_imgidx=None, augment=None):
        super().__init__(batch_size, data_shape, dtype, seed, rank, num_workers)
        if not (_positive_int(num_threads) and _positive_int(prefetch)):
            raise UsageError(f"num_threads and prefetch must be >= 1, got {num_threads!r} and {prefetch!r}")
        if num_classes is not None and not _positive_int(num_classes):
            raise UsageError(f"num_classes must be None or a positive integer, got {num_classes!r}")
        if augment is not None and not isinstance(augment, Augmentation):
            raise UsageError(f"augment must be None or an Augmentation, got {augment!r}")
        self.augment = augment if augment is not None else Augmentation()
        self.shuffle, self.rand_mirror, self.prefetch = bool(shuffle), bool(rand_mirror), int(prefetch)
        self.path = path_imgrec
        self._reader, self._keys, self.identity_range = open_record(path_imgrec, path_imgidx)
        self._frames = RecordFrames(path_imgrec)    # each record's framing checked before MXNet reads it
        folder = os.path.dirname(os.path.abspath(path_imgrec))
        prop = read_property(folder)
        if num_classes is not None and prop is not None and num_classes != prop[0]:
            raise UsageError(f"num_classes={num_classes} but {folder}/property says {prop[0]}")
        self.num_classes = num_classes if num_classes is not None else (prop[0] if prop else None)
        self.num_images = len(self._keys)
        self.num_batches = self.num_images // self.global_batch
        if self.num_batches == 0:
            raise UsageError(f"{path_imgrec}: {self.num_images} images over {self.num_workers} workers "
                             f"give {self.num_images // self.num_workers} per rank, "
                             f"fewer than batch_size={batch_size}")
        self._lock = threading.Lock()  # one reader handle, shared by the decode threads
        self._pool = ThreadPoolExecutor(max_workers=int(num_threads), thread_name_prefix="FaceRecordIter")
        self._num_chunks = int(num_threads)
        self._pending = collections.deque()  # (data, labels, futures) of scheduled batches, in order
        self._start_epoch(0, 0)

    def _start_epoch(self, epoch, image):
        for _, _, futures in self._pending:
            for future in futures:
                future.cancel()
        self._pending.clear()
        self.epoch, self.image_in_epoch, self._next_to_schedule = epoch, image, image
        self._order = self._keys[np.random.default_rng((self.seed, epoch)).permutation(self.num_images)
                                 if self.shuffle else np.arange(self.num_images)]
        self._schedule()

    def _schedule(self):
        while len(self._pending) < self.prefetch and self._next_to_schedule + self.global_batch <= self.num_images:
            lo, hi = self._own_slice(self._next_to_schedule)
            mirror = (self._per_image(0, lambda rng, n: rng.random(n) < 0.5, lo, hi) if self.rand_mirror
                      else np.zeros(self.batch_size, dtype=bool))
            params = self._per_image(1, self.augment.draw, lo, hi) if self.augment.active else None
            data = np.empty((self.batch_size,) + self.data_shape, dtype=np.float32)
            labels = np.empty(self.batch_size, dtype=np.int64)
            bounds = np.linspace(0, self.batch_size, self._num_chunks + 1).astype(int)
            futures = [self._pool.submit(self._load, self._order[lo + a:lo + b], mirror[a:b],
                                         None if params is None else params[a:b], data[a:b], labels[a:b])
                       for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
            self._pending.append((data, labels, futures))
            self._next_to_schedule += self.global_batch

    def _images_per_epoch(self):
        return self.num_images

    def _load(self, keys, mirror, params, data_out, labels_out):
        """Read, decode, resize, augment (`params`: rows of Augmentation.draw, or None) and
        mirror `keys` into the given slices (runs in a pool thread)."""
        height, width = self.data_shape[1:]
        for j, key in enumerate(keys):
            try:
                with self._lock:
                    header, encoded = read_record(self._reader, self._frames, int(key))
            except UsageError as err:
                raise DataError(f"{self.path}: {err}") from None
            try:
                label = label_to_int(header, key)
            except ValueError as err:
                raise DataError(f"{self.path}: {err}") from None
            if self.num_classes is not None and label >= self.num_classes:
                raise DataError(f"{self.path}: record key {key}: label {label} outside [0, {self.num_classes})")
            labels_out[j] = label
            try:
                pixels = decode_rgb(encoded, (height, width))
            except OSError as err:
                raise DataError(f"{self.path}: record key {key}: {err}") from None
            if params is not None:
                pixels = augment_image(pixels, params[j])
            data_out[j] = (pixels[:, ::-1] if mirror[j] else pixels).transpose(2, 0, 1)

    def next(self):
        if not self._pending:
            raise StopIteration
        data, labels, futures = self._pending.popleft()
        self._schedule()  # keep the pool busy while this batch finishes
        for future in futures:
            future.result()
        self.image_in_epoch += self.global_batch
        return self._batch(mx.nd.array(data, dtype=self.dtype), labels)

    def close(self):
        """Stop the decode threads and close the record file."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._reader.close()
        self._frames.close()


class SyntheticIter(_EpochIter):
    """Random images (drawn once per rank) and uniform integer labels in [0, num_classes).

    Labels are drawn per position in the epoch's sequence like FaceRecordIter's mirrors
    (from (seed, epoch, 2, block)), rank r taking its slice of each global batch, so the
    labels of a global step are the same for every world size and a run is reproducible and
    resumable; num_classes may exceed 2**24 (labels are int64). Infinite unless num_batches
    is given (then StopIteration after num_batches global batches per epoch).
    """

    def __init__(self, batch_size, num_classes, data_shape=(3, 112, 112), seed=0, rank=0, num_workers=1,
                 dtype="float32", num_batches=None):
        super().__init__(batch_size, data_shape, dtype, seed, rank, num_workers)
        if not _positive_int(num_classes):
            raise UsageError(f"num_classes must be a positive integer, got {num_classes!r}")
        if num_batches is not None and not _positive_int(num_batches):
            raise UsageError(f"num_batches must be None or a positive integer, got {num_batches!r}")
        self.num_classes, self.num_batches = int(num_classes), num_batches
        rng = np.random.default_rng((self.seed, self.rank))
        self._data = mx.nd.array(rng.uniform(0, 255, (batch_size,) + self.data_shape), dtype=self.dtype)

    def _images_per_epoch(self):
        return None if self.num_batches is None else self.num_batches * self.global_batch

    def _start_epoch(self, epoch, image):
        self.epoch, self.image_in_epoch = epoch, image

    def next(self):
        last = self._images_per_epoch()
        if last is not None and self.image_in_epoch + self.global_batch > last:
            raise StopIteration
        labels = self._per_image(2, lambda rng, n: rng.integers(0, self.num_classes, size=n, dtype=np.int64),
                                 *self._own_slice(self.image_in_epoch))
        self.image_in_epoch += self.global_batch
        return self._batch(self._data, labels)
