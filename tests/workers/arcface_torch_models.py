"""Build insightface arcface_torch's backbones in PyTorch with random weights, save them as
arcface_torch does (`torch.save(backbone.state_dict(), path)`), and save what
tests/test_torch_weights.py compares: `python arcface_torch_models.py OUT_DIR PIXELS.npy`.

The networks are written here after arcface_torch/backbones/iresnet.py and mobilefacenet.py:
the same modules under the same attribute names (hence the same state dict keys) and the same
forward; arcface_torch fixes the final map at 7x7 (112 px), `side` also allows a smaller one.
Weights: PyTorch's initialisation, random BatchNorm scales and shifts (the `features`
BatchNorm1d's with random signs), random PReLU slopes, BN statistics of one batch of random
images. A process of its own: torch must be imported before horovod.mxnet (see
torch_reference_outputs.py).

vit_t is written after arcface_torch/backbones/vit.py in eval mode (patch masking and drop path
act only in training), with random LayerNorm scales and shifts too.

Writes to OUT_DIR, for NAME in r50, mbf and vit_t (112 px, D 512) and mbf_small32 (arcface_torch's
MobileFaceNet at scale 1, 32 px, D 32):
  NAME.pth                  the state dict
  NAME.npz                  its tensors (key -> array)
  NAME_embeddings.npy       (N, D) the network's embeddings in eval mode of PIXELS.npy (N, 3,
                            112, 112 raw RGB 0..255; 112 px networks), normalised as arcface_torch
                            does, (x / 255 - 0.5) / 0.5
and views.pth / views.npz (float16, bfloat16 as float32, int64, strided views sharing one
storage, a scalar, an empty tensor), legacy.pth (torch's legacy non-zip format),
whole_model.pth (torch.save of a module, not of its state dict) and data_parallel.pth
(mbf_small32's state dict under nn.DataParallel: every key prefixed "module.").
"""
import os
import sys

import torch  # noqa: F401  (first: see above)
from torch import nn
import numpy as np


def batch_norm(channels):
    return nn.BatchNorm2d(channels, eps=1e-05)


class IBasicBlock(nn.Module):
    def __init__(self, cin, planes, stride, downsample):
        super().__init__()
        self.bn1 = batch_norm(cin)
        self.conv1 = nn.Conv2d(cin, planes, 3, 1, 1, bias=False)
        self.bn2 = batch_norm(planes)
        self.prelu = nn.PReLU(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn3 = batch_norm(planes)
        self.downsample = downsample

    def forward(self, x):
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        return out + (x if self.downsample is None else self.downsample(x))


class IResNet(nn.Module):
    def __init__(self, units, num_features=512, side=7):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = batch_norm(64)
        self.prelu = nn.PReLU(64)
        cin = 64
        for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), units), start=1):
            shortcut = nn.Sequential(nn.Conv2d(cin, planes, 1, 2, bias=False), batch_norm(planes))
            blocks = [IBasicBlock(cin, planes, 2, shortcut)] + [IBasicBlock(planes, planes, 1, None)
                                                                 for _ in range(count - 1)]
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))
            cin = planes
        self.bn2 = batch_norm(512)
        self.dropout = nn.Dropout(p=0, inplace=True)
        self.fc = nn.Linear(512 * side * side, num_features)
        self.features = nn.BatchNorm1d(num_features, eps=1e-05)

    def forward(self, x):
        x = self.prelu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.features(self.fc(self.dropout(torch.flatten(self.bn2(x), 1))))


class ConvBlock(nn.Module):
    def __init__(self, cin, cout, kernel=1, stride=1, padding=0, groups=1, act=True):
        super().__init__()
        layers = [nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False), batch_norm(cout)]
        self.layers = nn.Sequential(*(layers + [nn.PReLU(cout)] if act else layers))

    def forward(self, x):
        return self.layers(x)


class DepthWise(nn.Module):
    def __init__(self, cin, cout, residual, stride, groups):
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(ConvBlock(cin, groups), ConvBlock(groups, groups, 3, stride, 1, groups=groups),
                                    ConvBlock(groups, cout, act=False))

    def forward(self, x):
        return x + self.layers(x) if self.residual else self.layers(x)


class Residual(nn.Module):
    def __init__(self, channels, count, groups):
        super().__init__()
        self.layers = nn.Sequential(*[DepthWise(channels, channels, True, 1, groups) for _ in range(count)])

    def forward(self, x):
        return self.layers(x)


class GDC(nn.Module):
    def __init__(self, num_features, side):
        super().__init__()
        self.layers = nn.Sequential(ConvBlock(512, 512, side, groups=512, act=False), nn.Flatten(),
                                    nn.Linear(512, num_features, bias=False), nn.BatchNorm1d(num_features))

    def forward(self, x):
        return self.layers(x)


class MobileFaceNet(nn.Module):
    def __init__(self, num_features=512, blocks=(1, 4, 6, 2), scale=2, side=7):
        super().__init__()
        stem = 64 * scale
        self.layers = nn.ModuleList([ConvBlock(3, stem, 3, 2, 1)])
        self.layers.append(ConvBlock(stem, stem, 3, 1, 1, groups=64) if blocks[0] == 1 else Residual(stem, blocks[0], 128))
        self.layers.extend([DepthWise(stem, 64 * scale, False, 2, 128), Residual(64 * scale, blocks[1], 128),
                            DepthWise(64 * scale, 128 * scale, False, 2, 256), Residual(128 * scale, blocks[2], 256),
                            DepthWise(128 * scale, 128 * scale, False, 2, 512), Residual(128 * scale, blocks[3], 256)])
        self.conv_sep = ConvBlock(128 * scale, 512)
        self.features = GDC(num_features, side)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.features(self.conv_sep(x))


class Attention(nn.Module):
    def __init__(self, dim, heads=8):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        batch, count, dim = x.shape
        qkv = self.qkv(x).reshape(batch, count, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        attention = ((qkv[0] @ qkv[1].transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attention @ qkv[2]).transpose(1, 2).reshape(batch, count, dim))


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.ReLU6(), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, 4 * dim)

    def forward(self, x):                 # eval: drop path is the identity
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, dim, patch=9):
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """arcface_torch's vit.py in eval mode (no patch masking, no drop path), 112 px: 144 tokens."""

    def __init__(self, dim=256, depth=12, num_features=512, count=144):
        super().__init__()
        self.patch_embed = PatchEmbed(dim)
        self.pos_embed = nn.Parameter(torch.randn(1, count, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.feature = nn.Sequential(nn.Linear(dim * count, dim, bias=False), nn.BatchNorm1d(dim, eps=2e-5),
                                     nn.Linear(dim, num_features, bias=False), nn.BatchNorm1d(num_features, eps=2e-5))
        self.mask_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)

    def forward(self, x):
        x = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.feature(self.norm(x).reshape(x.shape[0], -1))


def randomised(model, side, seed):
    """`model` with random BN scales/shifts and PReLU slopes, BN statistics of 8 random
    images, in eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d)):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
                module.momentum = None           # running statistics = the batch's
            elif isinstance(module, nn.PReLU):
                module.weight.uniform_(0.0, 0.5)
            elif isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
        features = {IResNet: lambda: model.features, VisionTransformer: lambda: model.feature[3]}.get(
            type(model), lambda: model.features.layers[3])()
        features.weight.mul_(torch.where(torch.rand(features.weight.shape) < 0.3, -1.0, 1.0))
        model.train()
        model(torch.rand(8, 3, side * 16, side * 16) * 2 - 1)      # (ViT: 112 px at side 7 too)
    return model.eval()


def arcface_input(pixels):
    return torch.from_numpy(pixels).div(255).sub(0.5).div(0.5)


def save(model, out, name, pixels=None):
    torch.save(model.state_dict(), os.path.join(out, name + ".pth"))
    np.savez(os.path.join(out, name + ".npz"), **{k: v.numpy() for k, v in model.state_dict().items()})
    if pixels is not None:
        with torch.no_grad():
            np.save(os.path.join(out, name + "_embeddings.npy"), model(arcface_input(pixels)).numpy())


def main(out, pixels_file):
    torch.set_num_threads(1)
    pixels = np.load(pixels_file)
    save(randomised(IResNet((3, 4, 14, 3)), 7, 0), out, "r50", pixels)
    save(randomised(MobileFaceNet(), 7, 1), out, "mbf", pixels)
    save(randomised(VisionTransformer(), 7, 3), out, "vit_t", pixels)
    small = randomised(MobileFaceNet(32, scale=1, side=2), 2, 2)
    save(small, out, "mbf_small32")
    torch.save(small.state_dict(), os.path.join(out, "legacy.pth"), _use_new_zipfile_serialization=False)
    torch.save(small, os.path.join(out, "whole_model.pth"))
    torch.save(nn.DataParallel(small).state_dict(), os.path.join(out, "data_parallel.pth"))
    base = torch.randn(5, 6)
    views = {"half": torch.randn(3, 4).half(), "columns": base[:, 1:3], "transposed": base.t(),
             "offset": base.view(-1)[7:13], "long": torch.arange(5), "scalar": torch.tensor(3.5),
             "empty": torch.zeros(0, 3), "bf16": torch.randn(4).bfloat16()}
    torch.save(views, os.path.join(out, "views.pth"))
    np.savez(os.path.join(out, "views.npz"), **{k: (v.float() if v.dtype == torch.bfloat16 else v).numpy()
                                               for k, v in views.items()})


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
