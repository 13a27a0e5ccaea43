"""arcface_torch's step as train_v2.py runs it on N processes: DDP, PartialFC_V2 sharded by class.

Facts of insightface recognition/arcface_torch (partial_fc_v2.py, train_v2.py, dataset.py) with
world size N > 1:
- each process reads its own batch of B/N images: a DistributedSampler over the dataset
  (shuffled by a generator seeded seed + epoch, padded to a multiple of N, rank r taking
  positions r, r + N, ...), batches of B/N, the last partial one dropped;
- the backbone is wrapped in DistributedDataParallel (gradients averaged over the processes,
  float16-compressed; `broadcast_buffers=False`: each process keeps its own BatchNorm
  statistics, and normalises over its own B/N images);
- PartialFC_V2 holds num_classes // N (+1 for the first num_classes % N ranks) centers per
  rank, class_start = num_classes // N * r + min(r, num_classes % N), drawn normal(0, 0.01)
  after the same seed on every rank; the embeddings and labels of all ranks are gathered
  (AllGather, whose backward sums the ranks' gradients of a rank's rows and multiplies them by
  N, to undo DDP's average); each rank scores the global batch against its centers, the margin
  goes on the targets it holds, and DistCrossEntropy takes the softmax across ranks (max and sum
  all-reduced) and the mean loss over the global batch;
- the backbone's gradient norm is clipped to 5 after DDP's average, then SGD.
Verification runs on rank 0 with its own BatchNorm statistics, as train_v2.py's callback does.
Sample rate 1 only here (every center scored).
"""
import os
import tempfile

import torch
import torch.nn.functional as F
from torch import distributed, nn

from .data import MemoryFaces, SEED
from .networks import build_network
from .training import CombinedMargin, Trainer, distributed_backbone


class AllGather(torch.autograd.Function):
    """Rows of every rank, in rank order; the backward sums each rank's gradients of this rank's
    rows and multiplies by the world size (DDP divides by it)."""

    @staticmethod
    def forward(ctx, rows):
        parts = [torch.empty_like(rows) for _ in range(distributed.get_world_size())]
        distributed.all_gather(parts, rows.contiguous())
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        distributed.all_reduce(grad)
        world, rank = distributed.get_world_size(), distributed.get_rank()
        rows = grad.shape[0] // world
        return grad[rank * rows:(rank + 1) * rows] * world


class DistCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the global batch of logits split by class over the ranks; a
    row's label is its position among this rank's classes, or -1."""

    @staticmethod
    def forward(ctx, logits, labels):
        row_max = logits.max(dim=1, keepdim=True)[0]
        distributed.all_reduce(row_max, distributed.ReduceOp.MAX)
        probabilities = (logits - row_max).exp()
        total = probabilities.sum(dim=1, keepdim=True)
        distributed.all_reduce(total)
        probabilities /= total
        held = torch.where(labels != -1)[0]
        target = torch.zeros(logits.shape[0], 1)
        target[held] = probabilities[held].gather(1, labels[held].view(-1, 1))
        distributed.all_reduce(target)
        ctx.save_for_backward(held, probabilities, labels)
        return -target.clamp_min(1e-30).log().mean()

    @staticmethod
    def backward(ctx, grad_loss):
        held, probabilities, labels = ctx.saved_tensors
        grad = probabilities.clone()
        grad[held, labels[held]] -= 1
        return grad * (grad_loss.item() / probabilities.shape[0]), None


class ShardedPartialFC(nn.Module):
    """This rank's centers of PartialFC_V2 and its distributed margin softmax loss (rate 1)."""

    def __init__(self, margin, embedding_size, num_classes):
        super().__init__()
        world, rank = distributed.get_world_size(), distributed.get_rank()
        self.num_local = num_classes // world + int(rank < num_classes % world)
        self.class_start = num_classes // world * rank + min(rank, num_classes % world)
        self.margin = margin
        self.weight = nn.Parameter(torch.normal(0, 0.01, (self.num_local, embedding_size)))

    def forward(self, local_embeddings, local_labels):
        embeddings = AllGather.apply(local_embeddings)
        parts = [torch.empty_like(local_labels) for _ in range(distributed.get_world_size())]
        distributed.all_gather(parts, local_labels.contiguous())
        labels = torch.cat(parts).long() - self.class_start
        labels[(labels < 0) | (labels >= self.num_local)] = -1
        cosine = F.linear(F.normalize(embeddings), F.normalize(self.weight)).clamp(-1, 1)
        held = torch.where(labels != -1)[0]
        logits = cosine.clone()
        logits[held] = self.margin(cosine[held], labels[held]) / self.margin.scale   # targets held here
        return DistCrossEntropy.apply(logits * self.margin.scale, labels)


def rank_batches(faces, batch_size, rank, world, seed=SEED):
    """Endless batches of B/N images for `rank` as a DistributedSampler and a drop-last loader
    give them, each image flipped with p 0.5."""
    count, epoch = len(faces.labels), 0
    generator = torch.Generator().manual_seed(seed + 1000 * (rank + 1))
    while True:
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed + epoch))
        padded = torch.cat([order, order[:(-count) % world]])
        mine = padded[rank::world]
        for start in range(0, len(mine) - batch_size + 1, batch_size):
            chosen = mine[start:start + batch_size]
            images = faces.images[chosen]
            mirrored = torch.rand(batch_size, generator=generator) < 0.5
            yield torch.where(mirrored.view(-1, 1, 1, 1), images.flip(3), images), faces.labels[chosen]
        epoch += 1


def pairs_accuracy(backbone, target_bin, image_size):
    """10-fold verification accuracy of the backbone on a .bin's pairs (sample_fc's scoring)."""
    from sample_fc.data.bin_format import load_bin
    from sample_fc.verification import score
    from .scoring import embed_pairs
    images, issame = load_bin(target_bin, image_size)
    return score(embed_pairs(backbone, images), issame).accuracy


def train_rank(rank, world, recipe, lrs, rec_folder, threads, store, result_path, target_bin):
    """One process of the N: trains recipe.steps steps; rank 0 writes {losses, accuracy on
    target_bin's pairs} with torch.save to result_path."""
    import mxnet  # noqa: F401  (the .rec reader's; importing it leaves torch 1 thread: set them after)
    torch.set_num_threads(threads)
    distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    torch.manual_seed(recipe.seed)        # train_v2.py: the same seed on every rank
    backbone = distributed_backbone(build_network(recipe.network, recipe.image_size, recipe.embedding_size))
    head = ShardedPartialFC(CombinedMargin(recipe.scale, *recipe.margins), recipe.embedding_size, recipe.classes)
    trainer = Trainer(backbone, head, recipe.lr, recipe.weight_decay, lr_at=lambda n: lrs[min(n, len(lrs)) - 1],
                      optimizer=recipe.optimizer)
    batches = rank_batches(MemoryFaces.from_rec(rec_folder), recipe.global_batch // world, rank, world, recipe.seed)
    losses = [float(trainer.step(*next(batches))) for _ in range(recipe.steps)]
    if rank == 0:
        torch.save({"losses": losses, "accuracy": pairs_accuracy(backbone.module, target_bin, recipe.image_size)},
                   result_path)
    distributed.destroy_process_group()


def run_ddp(recipe, lrs, rec_folder, world, threads, target_bin):
    """Train the recipe as `world` DDP processes of `threads` torch threads on this machine
    (torch.multiprocessing, Gloo); returns rank 0's {"losses": per step, "accuracy": on the
    pairs of target_bin, with its own BatchNorm statistics}."""
    if recipe.sample_rate != 1:
        raise ValueError(f"the DDP yardstick scores every center (sample rate 1), not {recipe.sample_rate}")
    if recipe.global_batch % world:
        raise ValueError(f"global batch {recipe.global_batch} is not a multiple of {world} processes")
    folder = tempfile.mkdtemp(prefix="yardstick_ddp_")
    result_path = os.path.join(folder, "result.pt")
    torch.multiprocessing.spawn(train_rank, nprocs=world, join=True,
                                args=(world, recipe, lrs, rec_folder, threads, os.path.join(folder, "store"),
                                      result_path, target_bin))
    return torch.load(result_path)
