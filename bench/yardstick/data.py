"""arcface_torch's data path from a .rec, two ways: decoded once into memory, or per step by workers.

Facts of insightface recognition/arcface_torch/dataset.py (MXFaceDataset, get_dataloader):
record 0 of train.idx/.rec is a header when its flag is > 0, and the images are records
1 .. label[0] - 1 (else every key); a record's label is its header's (the first if a list);
the JPEG is decoded by mx.image.imdecode (RGB, HWC uint8); the transform is
RandomHorizontalFlip (p 0.5), ToTensor (CHW, / 255) and Normalize(0.5, 0.5): (x / 255 - 0.5) / 0.5.
The loader (config.num_workers = 2) shuffles with a generator seeded by seed + epoch, drops the
last partial batch, and DataLoaderX runs the loader's iterator in a background thread holding
up to 6 batches (its CUDA copy stream and pinned memory have no CPU counterpart).
"""
import os
import queue
import threading

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

LOADER_WORKERS = 2        # configs/base.py num_workers
PREFETCH_BATCHES = 6      # dataset.py BackgroundGenerator(max_prefetch=6)
SEED = 2048               # configs/base.py seed


def image_indices(record):
    """Keys of the image records: 1 .. label[0] - 1 after a header record, else all keys."""
    import mxnet as mx
    header, _ = mx.recordio.unpack(record.read_idx(0))
    if header.flag > 0:
        return np.arange(1, int(header.label[0]))
    return np.array(list(record.keys))


def open_record(folder):
    import mxnet as mx
    rec, idx = os.path.join(folder, "train.rec"), os.path.join(folder, "train.idx")
    if not (os.path.exists(rec) and os.path.exists(idx)):
        raise FileNotFoundError(f"{folder} has no train.rec and train.idx")
    return mx.recordio.MXIndexedRecordIO(idx, rec, "r")


def normalised(rgb):
    """HWC (or NHWC) uint8 RGB to CHW (NCHW) float32 (x / 255 - 0.5) / 0.5, as ToTensor then
    Normalize(0.5, 0.5)."""
    pixels = torch.from_numpy(np.ascontiguousarray(np.moveaxis(rgb, -1, -3))).float().div_(255)
    return pixels.sub_(0.5).div_(0.5)


def decode(payload):
    """A record's image bytes to HWC uint8 RGB with MXNet's decoder, as MXFaceDataset does."""
    import mxnet as mx
    return mx.image.imdecode(payload).asnumpy()


class RecFaces(Dataset):
    """(normalised CHW image, label) per image record; flips at random when `flip`."""

    def __init__(self, folder, flip=True):
        self.folder, self.flip = folder, flip
        record = open_record(folder)
        self.keys = image_indices(record)
        record.close()
        self._record, self._pid = None, None

    def __len__(self):
        return len(self.keys)

    def _handle(self):
        # one handle per process: forked workers must not share a file offset
        if self._pid != os.getpid():
            self._record, self._pid = open_record(self.folder), os.getpid()
        return self._record

    def raw(self, index):
        """(HWC uint8 RGB, label) of image `index`."""
        import mxnet as mx
        header, payload = mx.recordio.unpack(self._handle().read_idx(int(self.keys[index])))
        label = header.label if np.isscalar(header.label) else header.label[0]
        return decode(payload), int(label)

    def __getitem__(self, index):
        rgb, label = self.raw(index)
        if self.flip and torch.rand(1).item() < 0.5:
            rgb = rgb[:, ::-1]
        return normalised(rgb), torch.tensor(label, dtype=torch.long)


def _seed_worker(worker_id):
    seed = SEED + worker_id           # their worker_init_fn: num_workers * rank + id + seed
    np.random.seed(seed)
    torch.manual_seed(seed)


def rec_loader(dataset, batch_size, workers=LOADER_WORKERS, seed=SEED):
    """A DataLoader as get_dataloader builds it on one process (shuffled, drop_last)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator,
                      num_workers=workers, drop_last=True, worker_init_fn=_seed_worker,
                      persistent_workers=workers > 0)


class Prefetched:
    """Batches of an endless pass over `loader`, read ahead by one thread (DataLoaderX's queue)."""

    def __init__(self, loader, depth=PREFETCH_BATCHES):
        self.batches = queue.Queue(depth)
        self.loader = loader
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._fill, daemon=True)
        self.thread.start()

    def _fill(self):
        while not self.stopped.is_set():
            for batch in self.loader:
                if not self._put(batch):
                    return

    def _put(self, batch):
        """Queue `batch` once there is room; False when close() was called meanwhile."""
        while not self.stopped.is_set():
            try:
                self.batches.put(batch, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def close(self):
        """Stop reading ahead and let the loader's workers end (a process running several
        trainings in turn, as bench.compare's --runs, must not keep each one's workers)."""
        self.stopped.set()
        self.thread.join()
        self.loader = None

    def __next__(self):
        return self.batches.get()

    def __iter__(self):
        return self


class MemoryFaces:
    """Every image decoded once and held normalised; batches drawn as the loader draws them."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    @classmethod
    def from_rec(cls, folder, limit=None):
        dataset = RecFaces(folder, flip=False)
        count = len(dataset) if limit is None else min(limit, len(dataset))
        pairs = [dataset[i] for i in range(count)]
        return cls(torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]))

    @classmethod
    def random(cls, count, image_size, num_classes, seed=0):
        """Uniform random pixels, normalised (their SyntheticDataset's kind of input)."""
        generator = torch.Generator().manual_seed(seed)
        pixels = torch.randint(0, 256, (count, 3, image_size, image_size), generator=generator)
        return cls(pixels.float().div_(255).sub_(0.5).div_(0.5),
                   torch.randint(0, num_classes, (count,), generator=generator))

    def batches(self, batch_size, seed=SEED, flip=True):
        """Endless shuffled batches (a new order each pass), each image flipped with p 0.5."""
        if batch_size > len(self.labels):
            raise ValueError(f"batch {batch_size} is larger than the {len(self.labels)} images held")
        generator = torch.Generator().manual_seed(seed)
        while True:
            order = torch.randperm(len(self.labels), generator=generator)
            for start in range(0, len(order) - batch_size + 1, batch_size):
                chosen = order[start:start + batch_size]
                images = self.images[chosen]
                if flip:
                    mirrored = torch.rand(batch_size, generator=generator) < 0.5
                    images = torch.where(mirrored.view(-1, 1, 1, 1), images.flip(3), images)
                yield images, self.labels[chosen]
