"""arcface_torch's training step on one process: PartialFC_V2, CombinedMarginLoss, SGD, clipping.

What train_v2.py does each step, as facts of insightface recognition/arcface_torch:
- partial_fc_v2.py: class centers `weight` (num_classes x D) start normal(0, 0.01). At
  sample_rate < 1 it keeps num_sample = int(sample_rate * num_classes) centers: every class of
  the batch plus random others (uniform scores, positives forced to the top, top-k, sorted),
  or only the positives when they are more; labels become positions in that sorted set. The
  logits are normalize(embeddings) @ normalize(centers).T clamped to [-1, 1]; the margin is
  applied; the loss is its distributed softmax cross-entropy, on one process a plain
  cross-entropy (mean over the batch).
- losses.py CombinedMarginLoss(s, m1, m2, m3, threshold): ArcFace (m1 = 1, m3 = 0) moves the
  target's angle by m2 without gradient (the logits' gradient is s, as if no margin),
  CosFace (m3 > 0) subtracts m3 from the target cosine; then times s. A threshold > 0 zeroes
  the non-target logits above it. train_v2.py passes s = 64.
- train_v2.py: SGD over two groups (backbone, then the centers) at cfg.lr, momentum 0.9 and
  cfg.weight_decay on every parameter with a gradient (BN, PReLU and biases included, the
  whole center matrix even when only some rows were sampled), or with cfg.optimizer "adamw"
  (its ViT configs) torch.optim.AdamW over the same two groups at cfg.lr and weight_decay
  (betas and eps torch's defaults); backward, then
  clip_grad_norm_(backbone.parameters(), 5), step, zero_grad, then the lr schedule
  (lr_scheduler.py: linear warm-up, then polynomial decay, power 1).
"""
import os
import tempfile
import warnings

import torch
import torch.nn.functional as F
from torch import nn

ARCFACE_SCALE = 64.0      # train_v2.py's CombinedMarginLoss(64, ...)
MOMENTUM = 0.9            # train_v2.py, fixed (config.momentum is not read)
CLIP_NORM = 5.0           # train_v2.py: clip_grad_norm_(backbone.parameters(), 5)


class CombinedMargin:
    """Margined, scaled logits from clamped cosines, as CombinedMarginLoss computes them."""

    def __init__(self, scale=ARCFACE_SCALE, m1=1.0, m2=0.0, m3=0.25, filter_threshold=0.0):
        if m1 == 1.0 and m3 == 0.0:
            self.kind = "arcface"
        elif m3 > 0 and m1 == 1.0 and m2 == 0.0:
            self.kind = "cosface"
        else:
            raise ValueError(f"margins m1={m1}, m2={m2}, m3={m3}: arcface_torch applies "
                             "(1, m2, 0) (ArcFace) or (1, 0, m3 > 0) (CosFace); it ignores or rejects others")
        self.scale, self.m1, self.m2, self.m3 = scale, m1, m2, m3
        self.filter_threshold = filter_threshold

    def __call__(self, cosine, labels):
        rows = torch.arange(labels.numel())
        if self.filter_threshold > 0:
            with torch.no_grad():
                drop = cosine > self.filter_threshold
                drop[rows, labels] = False
            cosine = cosine * (~drop)
        if self.kind == "arcface":
            with torch.no_grad():                    # values move, the gradient stays s
                angles = cosine.arccos()
                angles[rows, labels] += self.m2
                cosine.copy_(angles.cos_())
        else:
            cosine[rows, labels] -= self.m3
        return cosine * self.scale


def sample_centers(labels, num_classes, num_sample):
    """(sorted center indices kept, labels as positions among them): PartialFC_V2's sampling."""
    positives = torch.unique(labels, sorted=True)
    if num_sample >= positives.numel():
        scores = torch.rand(num_classes)
        scores[positives] = 2.0
        kept = torch.topk(scores, k=num_sample)[1].sort()[0]
    else:
        kept = positives
    return kept, torch.searchsorted(kept, labels)


class PartialFC(nn.Module):
    """Class centers and the margin softmax loss of PartialFC_V2, on one process."""

    def __init__(self, margin, embedding_size, num_classes, sample_rate=1.0):
        super().__init__()
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate {sample_rate} is not in (0, 1]")
        self.margin, self.num_classes, self.sample_rate = margin, num_classes, sample_rate
        self.num_sample = int(sample_rate * num_classes)
        self.weight = nn.Parameter(torch.normal(0, 0.01, (num_classes, embedding_size)))

    def forward(self, embeddings, labels):
        labels = labels.view(-1).long()
        centers = self.weight
        if self.sample_rate < 1:
            with torch.no_grad():
                kept, labels = sample_centers(labels, self.num_classes, self.num_sample)
            centers = self.weight[kept]
        cosine = F.linear(F.normalize(embeddings), F.normalize(centers)).clamp(-1, 1)
        return F.cross_entropy(self.margin(cosine, labels), labels)


OPTIMIZERS = ("sgd", "adamw")     # train_v2.py's cfg.optimizer


def make_optimizer(backbone, head, lr, weight_decay, optimizer="sgd"):
    """The optimizer as train_v2.py sets it up: two groups (backbone, centers; head None: the
    backbone's alone), weight decay on all of them; SGD with momentum 0.9, or AdamW (decoupled
    decay, torch's betas and eps)."""
    groups = [{"params": module.parameters()} for module in (backbone, head) if module is not None]
    if optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    if optimizer != "sgd":
        raise ValueError(f"optimizer {optimizer!r} is not one of {OPTIMIZERS}")
    return torch.optim.SGD(groups, lr=lr, momentum=MOMENTUM, weight_decay=weight_decay)


def scheduled_lr(base_lr, step, warmup_steps, total_steps, power=1.0):
    """lr after `step` scheduler steps: linear warm-up, then polynomial decay to 0 (PolynomialLRWarmup)."""
    if step == 0 or step > total_steps:
        return base_lr if step == 0 else 0.0
    if step <= warmup_steps:
        return base_lr * step / warmup_steps
    return base_lr * (1.0 - (step - warmup_steps) / (total_steps - warmup_steps)) ** power


def start_one_process_group():
    """A Gloo process group of this process alone (PartialFC_V2 and DDP need one)."""
    if not torch.distributed.is_initialized():
        store = os.path.join(tempfile.mkdtemp(prefix="yardstick_gloo_"), "store")
        torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


def distributed_backbone(backbone):
    """The backbone as train_v2.py wraps it: DistributedDataParallel (buffers not broadcast,
    16 MB buckets, unused parameters searched, static graph), gradients all-reduced as float16
    (fp16_compress_hook), here on a one-process group: the rounding and the bookkeeping stay."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    start_one_process_group()
    with warnings.catch_warnings():       # broadcast_buffers deprecated; find_unused_parameters not needed
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        wrapped = nn.parallel.DistributedDataParallel(module=backbone, broadcast_buffers=False, bucket_cap_mb=16,
                                                      find_unused_parameters=True)
        wrapped.register_comm_hook(None, fp16_compress_hook)
        wrapped.train()
        wrapped._set_static_graph()
    return wrapped


class Trainer:
    """One process's training step: data -> backbone -> PartialFC loss -> backward -> clip -> SGD.

    lr_at(n): the lr of update n (1, 2, ...); default arcface_torch's schedule (scheduled_lr:
    warm-up over warmup_steps, polynomial decay to total_steps). bench.compare passes
    sample_fc's recipe's schedule instead, so both sides train the same recipe. clip_norm: the
    backbone's gradient-norm clip (train_v2.py's 5; 0 = none). optimizer: "sgd" or "adamw"
    (make_optimizer). centers_sgd: None (the centers in that optimizer, as train_v2.py), or
    (lr factor, weight decay): the centers on an SGD of their own with momentum 0.9 at lr_at(n)
    times the factor, as sample_fc's bank trains them (bank_lr, bank_wd)."""

    def __init__(self, backbone, head, lr, weight_decay, warmup_steps=0, total_steps=10 ** 9, lr_at=None,
                 clip_norm=CLIP_NORM, optimizer="sgd", centers_sgd=None):
        self.backbone, self.head = backbone.train(), head.train()
        self.clip_norm = clip_norm          # 0: no clipping (train_v2.py always clips at 5)
        if centers_sgd is None:
            self.optimizers, self.lr_factors = [make_optimizer(backbone, head, lr, weight_decay, optimizer)], [1.0]
        else:
            factor, centers_decay = centers_sgd
            self.optimizers = [make_optimizer(backbone, None, lr, weight_decay, optimizer),
                               torch.optim.SGD(head.parameters(), lr=lr * factor, momentum=MOMENTUM,
                                               weight_decay=centers_decay)]
            self.lr_factors = [1.0, factor]
        self.optimizer = self.optimizers[0]
        self.lr_at = lr_at or (lambda update: scheduled_lr(lr, update - 1, warmup_steps, total_steps))
        self.steps = 0
        self._set_lr(self.lr_at(1))

    def _set_lr(self, lr):
        for optimizer, factor in zip(self.optimizers, self.lr_factors):
            for group in optimizer.param_groups:
                group["lr"] = lr * factor

    def step(self, images, labels, mark=lambda stage: None):
        """One update; mark(stage) is called as each stage ends (forward, head, backward, clip,
        update), e.g. by a stages.StageClock timing them."""
        # forward: embeddings, then the centers' margin softmax loss
        embeddings = self.backbone(images)
        mark("forward")
        loss = self.head(embeddings, labels)
        mark("head")
        # backward, the backbone's gradient norm clipped to 5, the SGD update
        loss.backward()
        mark("backward")
        if self.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.backbone.parameters(), self.clip_norm)
        mark("clip")
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad()
        # the lr schedule steps after every update
        self.steps += 1
        self._set_lr(self.lr_at(self.steps + 1))
        mark("update")
        return loss.detach()
