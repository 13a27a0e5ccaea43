"""arcface_torch's backbones, written here: its MobileFaceNet (`mbf`), IResNet (`r50`, ...) and
Vision Transformers (`vit_t`, ...; VisionTransformer below).

The layouts are those of insightface recognition/arcface_torch/backbones/mobilefacenet.py and
iresnet.py, module for module and in the same registration order, so a state dict of theirs
maps onto ours entry by entry (upstream.copy_state_in_order). One change, for small images:
the final spatial size follows the input (theirs is fixed at 7x7 for 112 px), so the GDC's
depthwise kernel (mbf) and the fc's input width (IResNet) are the final map's, 2x2 at 32 px.

    mbf (get_mbf: blocks 1, 4, 6, 2 at scale 2)             112 px      32 px
      stem      conv3x3 s2 128, grouped conv3x3 128 (64 groups)  56x56   16x16
      stage 1   down block 128 (width 128), 4 residual (128)     28x28    8x8
      stage 2   down block 256 (width 256), 6 residual (256)     14x14    4x4
      stage 3   down block 256 (width 512), 2 residual (256)      7x7     2x2
      conv_sep  conv1x1 512, then GDC: depthwise conv over the whole map (linear),
                flatten, Linear(512, D, no bias), BatchNorm1d(D)

A block is conv1x1 to its width (BN, PReLU) -> depthwise conv3x3 (BN, PReLU) -> linear conv1x1
(BN); residual blocks add their input. IResNet: conv3x3 64 (BN, PReLU), four stages of
IBasicBlocks (BN -> conv3x3 -> BN -> PReLU -> conv3x3 (stride) -> BN, plus the input or a
strided conv1x1+BN), then BN, flatten, dropout, Linear(512 * side^2, D) and a BatchNorm1d whose
scale stays 1 (not trained). Initialisation as theirs: mbf's convs and linear Kaiming normal
(fan-out, ReLU gain); IResNet's convs normal(0, 0.1), its fc PyTorch's default.
"""
import math

import torch
from torch import nn

EMBEDDING_SIZE = 512               # their num_features default (config.embedding_size)
MBF_BLOCKS, MBF_SCALE = (1, 4, 6, 2), 2
SEP_CHANNELS = 512                 # conv_sep and GDC channels, not scaled
IRESNET_UNITS = {"r18": (2, 2, 2, 2), "r34": (3, 4, 6, 3), "r50": (3, 4, 14, 3),
                 "r100": (3, 13, 30, 3), "r200": (6, 26, 60, 6)}
IRESNET_WIDTHS = (64, 128, 256, 512)
# arcface_torch's ViTs (backbones/__init__.py, vit.py): (width, depth, drop path rate, patch masking
# ratio); 9 px patches, 8 heads, MLP 4 x the width with ReLU6, no qkv bias
VIT_SHAPES = {"vit_t": (256, 12, 0.1, 0.1), "vit_t_dp005_mask0": (256, 12, 0.05, 0.0),
              "vit_s": (512, 12, 0.1, 0.1), "vit_s_dp005_mask_0": (512, 12, 0.05, 0.0),
              "vit_b": (512, 24, 0.1, 0.1), "vit_b_dp005_mask_005": (512, 24, 0.05, 0.05),
              "vit_l_dp005_mask_005": (768, 24, 0.05, 0.05)}
VIT_PATCH, VIT_HEADS = 9, 8
NETWORKS = ("mbf",) + tuple(IRESNET_UNITS) + tuple(VIT_SHAPES)


def final_side(image_size, halvings=4):
    """Side of the last feature map: each stride-2 conv (kernel 3, pad 1) takes ceil(n / 2)."""
    side = image_size
    for _ in range(halvings):
        side = math.ceil(side / 2)
    return side


class ConvUnit(nn.Sequential):
    """conv (no bias) -> BatchNorm2d (-> PReLU): their ConvBlock, or LinearBlock without PReLU."""

    def __init__(self, cin, cout, kernel=1, stride=1, padding=0, groups=1, activation=True):
        layers = [nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        if activation:
            layers.append(nn.PReLU(cout))
        super().__init__(*layers)


class InvertedBlock(nn.Module):
    """conv1x1 to `width` -> depthwise conv3x3 (stride) -> linear conv1x1 to `cout` (+ input)."""

    def __init__(self, cin, width, cout, stride, residual):
        super().__init__()
        self.residual = residual
        self.body = nn.Sequential(ConvUnit(cin, width),
                                  ConvUnit(width, width, 3, stride, 1, groups=width),
                                  ConvUnit(width, cout, activation=False))

    def forward(self, x):
        return x + self.body(x) if self.residual else self.body(x)


def residual_stack(channels, blocks, width):
    """`blocks` residual inverted blocks at `channels` (their Residual)."""
    return nn.Sequential(*[InvertedBlock(channels, width, channels, 1, True) for _ in range(blocks)])


class GlobalDepthwiseHead(nn.Module):
    """Linear depthwise conv over the whole final map -> flatten -> Linear -> BatchNorm1d (GDC)."""

    def __init__(self, side, embedding_size):
        super().__init__()
        self.body = nn.Sequential(ConvUnit(SEP_CHANNELS, SEP_CHANNELS, side, groups=SEP_CHANNELS,
                                           activation=False),
                                  nn.Flatten(),
                                  nn.Linear(SEP_CHANNELS, embedding_size, bias=False),
                                  nn.BatchNorm1d(embedding_size))

    def forward(self, x):
        return self.body(x)


class MobileFaceNet(nn.Module):
    """arcface_torch's MobileFaceNet: normalised images in, `embedding_size` features out."""

    def __init__(self, image_size, embedding_size=EMBEDDING_SIZE, blocks=MBF_BLOCKS, scale=MBF_SCALE):
        super().__init__()
        low, high = 64 * scale, 128 * scale
        if blocks[0] == 1:
            stem_second = ConvUnit(low, low, 3, 1, 1, groups=64)
        else:
            stem_second = residual_stack(low, blocks[0], 128)
        self.stages = nn.ModuleList([
            ConvUnit(3, low, 3, 2, 1), stem_second,
            InvertedBlock(low, 128, low, 2, False), residual_stack(low, blocks[1], 128),
            InvertedBlock(low, 256, high, 2, False), residual_stack(high, blocks[2], 256),
            InvertedBlock(high, 512, high, 2, False), residual_stack(high, blocks[3], 256)])
        self.separable = ConvUnit(high, SEP_CHANNELS)
        self.embedding = GlobalDepthwiseHead(final_side(image_size), embedding_size)
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        for stage in self.stages:
            x = stage(x)
        return self.embedding(self.separable(x))


class IBasicBlock(nn.Module):
    """BN -> conv3x3 -> BN -> PReLU -> conv3x3 (stride) -> BN, plus the (downsampled) input."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.norm_in = nn.BatchNorm2d(cin)
        self.conv_a = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.norm_a = nn.BatchNorm2d(cout)
        self.act = nn.PReLU(cout)
        self.conv_b = nn.Conv2d(cout, cout, 3, stride, 1, bias=False)
        self.norm_out = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.norm_out(self.conv_b(self.act(self.norm_a(self.conv_a(self.norm_in(x))))))
        return out + (x if self.shortcut is None else self.shortcut(x))


class IResNet(nn.Module):
    """arcface_torch's IResNet: normalised images in, `embedding_size` features out."""

    def __init__(self, units, image_size, embedding_size=EMBEDDING_SIZE, dropout=0.0):
        super().__init__()
        self.stem = ConvUnit(3, IRESNET_WIDTHS[0], 3, 1, 1)
        stages, cin = [], IRESNET_WIDTHS[0]
        for count, width in zip(units, IRESNET_WIDTHS):
            stages.append(nn.Sequential(*[IBasicBlock(cin if i == 0 else width, width, 2 if i == 0 else 1)
                                          for i in range(count)]))
            cin = width
        self.stages = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(cin)
        self.dropout = nn.Dropout(p=dropout, inplace=True)
        self.fc = nn.Linear(cin * final_side(image_size) ** 2, embedding_size)
        self.features = nn.BatchNorm1d(embedding_size)
        self.features.weight.requires_grad_(False)       # theirs: scale fixed at 1
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.normal_(module.weight, 0, 0.1)

    def forward(self, x):
        x = self.norm(self.stages(self.stem(x)))
        return self.features(self.fc(self.dropout(x.flatten(1))))


class DropPath(nn.Module):
    """Stochastic depth per sample (timm's DropPath, which vit.py uses): in training each sample's
    branch is kept with probability 1 - rate and then divided by it; the identity in eval."""

    def __init__(self, rate):
        super().__init__()
        self.rate = rate

    def forward(self, x):
        if not self.training or self.rate == 0:
            return x
        keep = 1.0 - self.rate
        return x / keep * torch.floor(keep + torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype))


class Attention(nn.Module):
    """Multi-head self-attention: qkv (no bias), softmax(q k^T / sqrt(head width)) v, proj."""

    def __init__(self, width, heads=VIT_HEADS):
        super().__init__()
        self.heads, self.scale = heads, (width // heads) ** -0.5
        self.qkv = nn.Linear(width, width * 3, bias=False)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        batch, count, width = x.shape
        q, k, v = self.qkv(x).reshape(batch, count, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        weights = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, count, width))


class TransformerBlock(nn.Module):
    """x + drop_path(attn(norm1(x))), then x + drop_path(mlp(norm2(x))); mlp: fc1 -> ReLU6 -> fc2.
    Registered as vit.py's Block registers them (norm1, norm2, attn, drop_path, mlp), so the state
    dict's order is theirs (copy_state_in_order)."""

    def __init__(self, width, drop_path):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width)
        self.drop_path = DropPath(drop_path)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU6(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class VisionTransformer(nn.Module):
    """arcface_torch's ViT: 9 px patches (a conv of stride 9: 12 x 12 tokens from 112 px) plus a
    position embedding, `depth` pre-norm blocks (drop path rising linearly from 0 to its rate),
    LayerNorm, the tokens flattened -> Linear (no bias) -> BatchNorm1d -> Linear to D (no bias) ->
    BatchNorm1d. In training a share `mask_ratio` of each sample's tokens is left out of the
    blocks (random per sample) and replaced after the final LayerNorm by a learned mask token.
    Initialisation as theirs: Linear weights and the position embedding truncated normal (std
    0.02), Linear biases 0, the mask token normal (std 0.02)."""

    def __init__(self, image_size, width, depth, drop_path_rate, mask_ratio, embedding_size=EMBEDDING_SIZE):
        super().__init__()
        self.count, self.width, self.mask_ratio = (image_size // VIT_PATCH) ** 2, width, mask_ratio
        self.patch_embed = nn.Conv2d(3, width, VIT_PATCH, VIT_PATCH)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.count, width))
        rates = [drop_path_rate * index / max(depth - 1, 1)
                 for index in range(depth)]   # torch.linspace(0, rate, depth)
        self.blocks = nn.ModuleList([TransformerBlock(width, rate) for rate in rates])
        self.norm = nn.LayerNorm(width)
        self.feature = nn.Sequential(nn.Linear(width * self.count, width, bias=False), nn.BatchNorm1d(width, eps=2e-5),
                                     nn.Linear(width, embedding_size, bias=False),
                                     nn.BatchNorm1d(embedding_size, eps=2e-5))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x):
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        masking = self.training and self.mask_ratio > 0
        if masking:                       # keep the tokens of the smallest noise, in their noise order
            order = torch.argsort(torch.rand(x.shape[0], self.count), dim=1)
            keep = int(self.count * (1 - self.mask_ratio))
            x = torch.gather(x, 1, order[:, :keep, None].expand(-1, -1, self.width))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        if masking:                       # back to token order, the left-out ones the mask token
            filled = torch.cat([x, self.mask_token.expand(x.shape[0], self.count - x.shape[1], -1)], dim=1)
            x = torch.gather(filled, 1, torch.argsort(order, dim=1)[:, :, None].expand(-1, -1, self.width))
        return self.feature(x.reshape(x.shape[0], -1))


def build_network(name, image_size, embedding_size=EMBEDDING_SIZE):
    """`mbf`, `r18`..`r200` or a ViT as arcface_torch's get_model builds it (dropout 0, fp16 off)."""
    if name == "mbf":
        return MobileFaceNet(image_size, embedding_size)
    if name in IRESNET_UNITS:
        return IResNet(IRESNET_UNITS[name], image_size, embedding_size)
    if name in VIT_SHAPES:
        return VisionTransformer(image_size, *VIT_SHAPES[name], embedding_size=embedding_size)
    raise ValueError(f"network {name!r} is not one of {', '.join(NETWORKS)}")


def parameter_count(model):
    """Number of parameter values, trained or not (as sum(p.numel() for p in parameters()))."""
    return sum(p.numel() for p in model.parameters())
