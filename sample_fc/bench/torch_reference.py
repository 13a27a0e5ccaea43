"""A plain PyTorch trainer of the same recipe, the reference sample_fc's learning is compared
against (see sample_fc/bench/compare.py). Not used by training; needs `torch` (CPU build).

It follows the field's standard trainer (insightface arcface_torch) where that differs from
a literal port of sample_fc: PyTorch's default parameter initialisation, weight decay on
every parameter, the backbone's gradients clipped to a global norm of `clip_grad_norm`,
one process with the whole global batch, and the full softmax over all class centers
(PartialFC_V2 at sample rate 1 computes exactly that). The networks are sample_fc's layer for
layer (MobileFaceNet and IResNet: symbols/; `network(name, ...)` builds one by its name), the
margin its CombinedMargin, the data the same .rec read by the same iterator, the score the same
10-fold verification. tests/test_torch_reference.py holds each network to its MXNet symbol.
"""
import math
import time

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from sample_fc.optimizers import make_schedule
from sample_fc.verification import score, to_nchw
from symbols.common import BN_EPS, BN_MOMENTUM, DOWNSAMPLE, PRELU_INIT
from symbols import iresnet, mobilefacenet
from symbols.mobilefacenet import SEP_CHANNELS, STAGES, STEM_BLOCK_WIDTH, STEM_CHANNELS, STEM_GROUPS


def batch_norm(channels, dims=2):
    """BatchNorm with the symbols' eps and momentum (PyTorch's momentum is 1 - MXNet's)."""
    kind = nn.BatchNorm2d if dims == 2 else nn.BatchNorm1d
    return kind(channels, eps=BN_EPS, momentum=1.0 - BN_MOMENTUM)


class ConvBN(nn.Sequential):
    """conv (no bias) -> BN (-> PReLU), as symbols.common.conv_bn."""

    def __init__(self, cin, cout, kernel=3, stride=1, groups=1, pad=None, act=True):
        pad = kernel // 2 if pad is None else pad
        layers = [nn.Conv2d(cin, cout, kernel, stride, pad, groups=groups, bias=False), batch_norm(cout)]
        if act:
            layers.append(nn.PReLU(cout, init=PRELU_INIT))
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, width, cout, stride, residual):
        super().__init__()
        self.residual = residual
        self.body = nn.Sequential(ConvBN(cin, width, 1), ConvBN(width, width, 3, stride, groups=width),
                                  ConvBN(width, cout, 1, act=False))

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


class EmbeddingHead(nn.Module):
    """Flatten -> Linear -> BatchNorm1d with its scale frozen at 1, as symbols.common.embedding_head."""

    def __init__(self, features, embedding_size, bias):
        super().__init__()
        self.fc = nn.Linear(features, embedding_size, bias=bias)
        self.features = batch_norm(embedding_size, dims=1)
        self.features.weight.requires_grad_(False)      # fix_gamma, as sample_fc's 'embeddings'

    def forward(self, x):
        return self.features(self.fc(torch.flatten(x, 1)))


def normalise(pixels):
    """Raw pixels 0..255 to (x - 127.5) / 128, as the symbols do in the graph."""
    return (pixels - 127.5) * 0.0078125


class MobileFaceNet(nn.Module):
    """symbols/mobilefacenet.py in PyTorch: raw pixels 0..255 in, embeddings out."""

    def __init__(self, embedding_size, image_size, blocks=(1, 4, 6, 2), scale=1):
        super().__init__()
        side, stem = image_size // DOWNSAMPLE, STEM_CHANNELS * scale
        layers = [ConvBN(3, stem, 3, 2)]
        if blocks[0] == 1:
            layers.append(ConvBN(stem, stem, 3, groups=STEM_GROUPS))
        else:
            layers += [InvertedResidual(stem, STEM_BLOCK_WIDTH, stem, 1, residual=True) for _ in range(blocks[0])]
        cin = stem
        for (channels, down_width, width, _), units in zip(STAGES, blocks[1:]):
            channels *= scale
            layers.append(InvertedResidual(cin, down_width, channels, 2, residual=False))
            layers += [InvertedResidual(channels, width, channels, 1, residual=True) for _ in range(units)]
            cin = channels
        layers += [ConvBN(cin, SEP_CHANNELS, 1),
                   ConvBN(SEP_CHANNELS, SEP_CHANNELS, side, groups=SEP_CHANNELS, pad=0, act=False)]
        self.body = nn.Sequential(*layers)
        self.head = EmbeddingHead(SEP_CHANNELS, embedding_size, bias=False)

    def forward(self, pixels):
        return self.head(self.body(normalise(pixels)))


class IBasicBlock(nn.Module):
    """BN -> conv3x3 -> BN -> PReLU -> conv3x3 (stride) -> BN, plus the identity or a
    conv1x1 -> BN shortcut, as symbols.iresnet.residual_unit."""

    def __init__(self, cin, channels, stride):
        super().__init__()
        self.body = nn.Sequential(batch_norm(cin), nn.Conv2d(cin, channels, 3, 1, 1, bias=False),
                                  batch_norm(channels), nn.PReLU(channels, init=PRELU_INIT),
                                  nn.Conv2d(channels, channels, 3, stride, 1, bias=False), batch_norm(channels))
        self.shortcut = None
        if stride != 1 or cin != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, channels, 1, stride, bias=False), batch_norm(channels))

    def forward(self, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


class IResNet(nn.Module):
    """symbols/iresnet.py in PyTorch (arcface_torch's IResNet): raw pixels 0..255 in, embeddings out."""

    def __init__(self, embedding_size, image_size, units):
        super().__init__()
        side = image_size // DOWNSAMPLE
        layers, cin = [ConvBN(3, iresnet.STEM_CHANNELS, 3, 1)], iresnet.STEM_CHANNELS
        for channels, count in zip(iresnet.STAGE_CHANNELS, units):
            layers += [IBasicBlock(cin if unit == 0 else channels, channels, 2 if unit == 0 else 1)
                       for unit in range(count)]
            cin = channels
        layers.append(batch_norm(cin))
        self.body = nn.Sequential(*layers)
        self.head = EmbeddingHead(cin * side * side, embedding_size, bias=True)

    def forward(self, pixels):
        return self.head(self.body(normalise(pixels)))


def network(name, embedding_size, image_size):
    """The PyTorch network of sample_fc's backbone `name` (symbols.NETWORKS)."""
    if name in mobilefacenet.CONFIGS:
        blocks, scale = mobilefacenet.CONFIGS[name]
        return MobileFaceNet(embedding_size, image_size, blocks, scale)
    if name in iresnet.UNITS:
        return IResNet(embedding_size, image_size, iresnet.UNITS[name])
    raise ValueError(f"no PyTorch reference for network {name!r}")


def xavier_magnitude2_(model):
    """sample_fc's initialisation: MXNet Xavier(rnd_type='uniform', factor_type='avg',
    magnitude=2) on conv/FC weights (fan computed as MXNet does), BN gamma 1 / beta 0."""
    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            weight = module.weight
            receptive = weight[0][0].numel()
            fan_in, fan_out = weight.shape[1] * receptive, weight.shape[0] * receptive
            bound = math.sqrt(2.0 / ((fan_in + fan_out) / 2.0))
            with torch.no_grad():
                weight.uniform_(-bound, bound)


def margin_logits(cosine, labels, s, m1, m2, m3):
    """s * (cos(m1 * theta + m2) - m3) at each row's target, s * cos elsewhere."""
    target = cosine.gather(1, labels[:, None]).clamp(-1.0, 1.0)
    if m1 != 1.0 or m2 != 0.0:
        target_m = torch.cos(m1 * torch.acos(target) + m2) - m3
    else:
        target_m = target - m3
    return s * cosine.scatter(1, labels[:, None], target_m)


def train(cfg, train_iter, val_images, val_issame, world_size, clip_grad_norm=5.0, init="torch",
          wd_all=True, mxnet_momentum=False, log=print, threads=None, speed_skip=20):
    """Train cfg's recipe (global batch batch_size * world_size from train_iter) and return
    {'losses': [(step, mean loss since the last report)], 'accuracy': float, 'seconds': float,
    'samples_per_s': global samples per second over the steps after the first `speed_skip`
    (None for a shorter run)}."""
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    model = network(cfg.network, cfg.embedding_size, cfg.image_size)
    if init == "xavier2":
        xavier_magnitude2_(model)
    centers = nn.Parameter(torch.randn(cfg.num_classes, cfg.embedding_size) * 0.01)
    lr = cfg.lr * (cfg.batch_size * world_size / 512 if cfg.lr_scale_by_world else 1.0)
    schedule = make_schedule(cfg.lr_schedule, lr, cfg.warmup_steps, cfg.max_update, cfg.lr_steps, cfg.lr_factor)
    # wd_all=False: MXNet's default, weight decay on weights and gammas (PReLU slopes too), not on betas
    decayed = [p for n, p in model.named_parameters() if p.requires_grad and (wd_all or n.endswith("weight"))]
    not_decayed = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in decayed)]
    optimizer = torch.optim.SGD([{"params": decayed + [centers], "weight_decay": cfg.wd},
                                 {"params": not_decayed, "weight_decay": 0.0}], lr=lr, momentum=cfg.momentum)
    losses, window, start, step = [], [], time.perf_counter(), 0
    speed_start = None
    model.train()
    while step < cfg.max_update:
        try:
            batch = train_iter.next()
        except StopIteration:
            train_iter.reset()
            continue
        step += 1
        new_lr = schedule(step)
        for group in optimizer.param_groups:
            if mxnet_momentum and group["lr"] != new_lr and new_lr > 0:
                # MXNet's SGD keeps lr-scaled steps in its momentum: at an lr change the
                # momentum goes on at the old lr; in PyTorch's units that is buffer * old / new
                for p in group["params"]:
                    state = optimizer.state.get(p, {})
                    if state.get("momentum_buffer") is not None:
                        state["momentum_buffer"].mul_(group["lr"] / new_lr)
            group["lr"] = new_lr
        pixels = torch.from_numpy(batch.data[0].asnumpy())
        labels = torch.from_numpy(batch.label[0].asnumpy().astype(np.int64))
        embeddings = model(pixels)
        cosine = F.linear(F.normalize(embeddings), F.normalize(centers))
        loss = F.cross_entropy(margin_logits(cosine, labels, cfg.loss_s, cfg.loss_m1, cfg.loss_m2,
                                             cfg.loss_m3), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad_norm:
            nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
        optimizer.step()
        window.append(float(loss.detach()))
        if step == speed_skip:
            speed_start = time.perf_counter()
        if step % cfg.frequent == 0 or step == cfg.max_update:
            losses.append((step, sum(window) / len(window)))
            log(f"torch step {step}/{cfg.max_update}  loss {losses[-1][1]:.4f}  "
                f"{time.perf_counter() - start:.0f} s")
            window = []
    end = time.perf_counter()
    seconds = end - start
    samples_per_s = ((step - speed_skip) * cfg.batch_size * world_size / (end - speed_start)
                     if speed_start is not None and step > speed_skip else None)
    model.eval()
    with torch.no_grad():
        images = torch.from_numpy(to_nchw(val_images))
        embeddings = model(images) + model(torch.flip(images, dims=[3]))
    result = score(embeddings.numpy(), val_issame)
    return {"losses": losses, "accuracy": result.accuracy, "seconds": seconds, "samples_per_s": samples_per_s}

