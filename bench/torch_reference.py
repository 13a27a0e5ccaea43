"""PyTorch networks and margin that follow sample_fc's own MXNet layouts layer for layer
(tests/test_torch_reference.py holds them to the symbols). bench.compare and
bench.step_breakdown now measure against the yardstick (bench/yardstick/:
arcface_torch's layouts and step) instead. Not used by training; needs `torch` (CPU build).

The networks are sample_fc's layer for layer (MobileFaceNet and IResNet: sample_fc/symbols/;
`network(name, ...)` builds one by its name), the margins its CombinedMargin (margin_logits) and
CurricularFace (curricular_loss, as the paper's published code computes it, with autograd).
"""
import math

import torch
from torch import nn

from sample_fc.symbols.common import BN_EPS, BN_MOMENTUM, DOWNSAMPLE, PRELU_INIT
from sample_fc import symbols
from sample_fc.symbols import iresnet
from sample_fc.symbols.mobilefacenet import SEP_CHANNELS, STAGES, STEM_BLOCK_WIDTH, STEM_CHANNELS, STEM_GROUPS


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
    """sample_fc/symbols/mobilefacenet.py in PyTorch: raw pixels 0..255 in, embeddings out."""

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
    """sample_fc/symbols/iresnet.py in PyTorch (arcface_torch's IResNet): raw pixels 0..255 in, embeddings out."""

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


FAMILIES = ("iresnet", "mobilefacenet")     # the families written here
                                            # (a ViT's oracle: tests/workers/arcface_torch_models.py)


def networks():
    """The names of symbols.NETWORKS this module has a PyTorch network for."""
    return tuple(name for name in symbols.NETWORKS if symbols.network(name).family in FAMILIES)


def network(name, embedding_size, image_size):
    """The PyTorch network of sample_fc's backbone `name` (symbols.NETWORKS)."""
    net = symbols.network(name)
    if net.family == "mobilefacenet":
        blocks, scale = net.shape
        return MobileFaceNet(embedding_size, image_size, blocks, scale)
    if net.family == "iresnet":
        return IResNet(embedding_size, image_size, net.shape)
    raise ValueError(f"no PyTorch reference for the {net.family} network {name!r}")


def margin_logits(cosine, labels, s, m1, m2, m3):
    """s * (cos(m1 * theta + m2) - m3) at each row's target, s * cos elsewhere."""
    target = cosine.gather(1, labels[:, None]).clamp(-1.0, 1.0)
    if m1 != 1.0 or m2 != 0.0:
        target_m = torch.cos(m1 * torch.acos(target) + m2) - m3
    else:
        target_m = target - m3
    return s * cosine.scatter(1, labels[:, None], target_m)


def curricular_loss(cosine, labels, s, m, t):
    """(mean cross-entropy, the updated t) of CurricularFace on `cosine` (N, K) with integer
    `labels`, its running mean `t` before the step: t is updated from the batch's target cosines
    first (no gradient), each negative above cos(theta_y + m) becomes c (t + c), the target
    cos(theta_y + m) (past theta_y = pi - m: c - m sin(pi - m)); autograd gives the gradient."""
    cos = cosine.clamp(-1.0, 1.0)
    target = cos.gather(1, labels[:, None])
    shifted = target * math.cos(m) - torch.sqrt(1.0 - target * target) * math.sin(m)
    final_target = torch.where(target > math.cos(math.pi - m), shifted, target - math.sin(math.pi - m) * m)
    with torch.no_grad():
        t = 0.01 * target.mean() + 0.99 * t
    hard = cos > shifted.detach()
    logits = torch.where(hard, cos * (t + cos), cos).scatter(1, labels[:, None], final_target)
    return torch.nn.functional.cross_entropy(s * logits, labels), float(t)
