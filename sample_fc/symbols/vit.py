"""Vision Transformers as insightface's arcface_torch defines them (backbones/vit.py): a patch
embedding (a 9 x 9 convolution of stride 9: 112 px -> 12 x 12 = 144 tokens), a learned position
embedding, `depth` pre-norm blocks (LayerNorm -> multi-head self-attention, 8 heads, no qkv bias
-> residual; LayerNorm -> MLP of 4 x the width with ReLU6 -> residual), stochastic depth (drop
path, its rate growing linearly from 0 at the first block to `drop_path` at the last), a final
LayerNorm, and the embedding head over all tokens: FC (tokens x width -> width, no bias) -> BN
-> FC (width -> embedding, no bias) -> BN (learned scale), both BNs with eps 2e-5.

Networks (arcface_torch's names; width, depth, drop path, its patch-masking ratio):
    vit_t 256, 12, 0.1, 0.1      vit_t_dp005_mask0 256, 12, 0.05, 0
    vit_s 512, 12, 0.1, 0.1      vit_s_dp005_mask_0 512, 12, 0.05, 0
    vit_b 512, 24, 0.1, 0.1      vit_b_dp005_mask_005 512, 24, 0.05, 0.05
    vit_l_dp005_mask_005 768, 24, 0.05, 0.05
Drop path is MXNet's Dropout with the mask shared over a sample's tokens and channels
(axes (1, 2)): each sample's residual branch is dropped whole with its probability and the kept
ones scaled by 1 / (1 - p), as timm's DropPath; nothing happens at inference.
Patch masking (arcface_torch's mask_ratio > 0): in training a share of each sample's tokens is
left out of the blocks and replaced after the final LayerNorm by a learned mask token (1 x 1 x
width). arcface_torch gathers the kept tokens into a shorter sequence; MXNet's shapes are fixed
per graph, so here every token goes through the blocks and a left-out one is (a) no key of any
attention (its score gets -1e9: softmax gives it weight 0 exactly) and (b) replaced by the mask
token after the final LayerNorm. The kept tokens compute what they would alone: attention is
the only op that mixes tokens. The keep mask is a Dropout of ones over (N, L, 1): drawn per
token in training (each left out with probability mask_ratio, where arcface_torch leaves out
exactly int(L * mask_ratio)), all ones at inference, where the graph is the unmasked one. The
`_mask0` networks have no mask token (arcface_torch's file holds one, unused). Any image side the other
networks take works (a multiple of 16; arcface_torch's 112 px uses 108 of them: 12 patches of 9).
"""
import mxnet as mx

from .common import ATTENTION_ENDS, BN_MOMENTUM, check_args, input_data
from . import catalog
from .network import Network

PATCH = 9                 # arcface_torch's patch_size for 112 px faces
HEADS = 8
MLP_RATIO = 4
LN_EPS = 1e-5             # torch.nn.LayerNorm's default
HEAD_BN_EPS = 2e-5        # the feature head's BatchNorm1d(eps=2e-5)
# (width, depth, drop path, mask ratio) of each ViT
CONFIGS = {name: entry.shape for name, entry in catalog.of_family('vit').items()}


def tokens(image_size):
    """How many tokens an image of `image_size` px makes (patches of PATCH px, the rest cut)."""
    return (image_size // PATCH) ** 2


def layer_norm(data, name, width):
    return mx.sym.LayerNorm(data, gamma=mx.sym.Variable(name + '_gamma', shape=(width,), init=mx.init.One()),
                            beta=mx.sym.Variable(name + '_beta', shape=(width,), init=mx.init.Zero()),
                            axis=-1, eps=LN_EPS, name=name)


def linear(data, name, hidden, bias=True):
    """A Linear over the last axis of (N, L, C)."""
    return mx.sym.FullyConnected(data, num_hidden=hidden, no_bias=not bias, flatten=False, name=name)


LEFT_OUT_SCORE = -1e9      # a left-out token's attention score as a key: exp() of it is 0


def attention(data, name, width, count, key_bias=None):
    """Multi-head self-attention of (N, L, width) tokens: qkv (no bias), softmax(q k^T / sqrt(d)
    + key_bias) v, the heads joined, then a Linear with bias (`<name>_proj`). key_bias: None, or
    (N H, 1, L) added to every query's scores (patch masking's left-out keys). The nodes from
    `<name>_qkv_heads` to `<name>_heads_joined` are what sample_fc/fused_ops.py trains as one
    operator on the CPU (found by those names: ATTENTION_ENDS)."""
    head = width // HEADS
    qkv = linear(data, name + '_qkv', 3 * width, bias=False)                      # (N, L, 3 W)
    qkv = mx.sym.reshape(qkv, (0, count, 3, HEADS, head), name=name + ATTENTION_ENDS[0])
    qkv = mx.sym.transpose(qkv, (2, 0, 3, 1, 4))                                     # (3, N, H, L, d)
    q, k, v = (mx.sym.reshape(mx.sym.squeeze(part, axis=0), (-1, count, head))   # (N H, L, d)
               for part in mx.sym.split(qkv, num_outputs=3, axis=0))
    scores = mx.sym.batch_dot(q, k, transpose_b=True) * (head ** -0.5)                # (N H, L, L)
    if key_bias is not None:
        scores = mx.sym.broadcast_add(scores, key_bias)
    weights = mx.sym.softmax(scores, axis=-1)
    mixed = mx.sym.reshape(mx.sym.batch_dot(weights, v), (-1, HEADS, count, head))   # (N, H, L, d)
    mixed = mx.sym.reshape(mx.sym.transpose(mixed, (0, 2, 1, 3)), (0, count, width), name=name + ATTENTION_ENDS[1])
    return linear(mixed, name + '_proj', width)


def drop_path(branch, name, rate):
    """The residual branch dropped per sample with probability `rate` in training (kept ones
    scaled by 1 / (1 - rate)); the identity at inference and for rate 0."""
    return mx.sym.Dropout(branch, p=rate, axes=(1, 2), name=name) if rate > 0 else branch


def block(data, name, width, count, rate, key_bias=None):
    """x + drop_path(attention(LN(x))); then x + drop_path(MLP(LN(x))), MLP = FC -> ReLU6 -> FC."""
    body = data + drop_path(attention(layer_norm(data, name + '_norm1', width), name + '_attn', width, count,
                                      key_bias), name + '_drop1', rate)
    hidden = mx.sym.clip(linear(layer_norm(body, name + '_norm2', width), name + '_fc1', MLP_RATIO * width), 0.0, 6.0)
    return body + drop_path(linear(hidden, name + '_fc2', width), name + '_drop2', rate)


def keep_mask(body, ratio):
    """(N, L, 1) of the (N, L, W) tokens `body`: 1 for a token the blocks see, 0 for one left out:
    a Dropout of ones (a fresh draw per token in training, each left out with probability `ratio`;
    all ones at inference)."""
    ones = mx.sym.ones_like(mx.sym.slice_axis(body, axis=2, begin=0, end=1))
    return mx.sym.Dropout(ones, p=ratio, name='patch_mask') > 0


def get_vit(embedding_size=512, image_size=112, dtype='float32', dropout=0.0, width=256, depth=12, drop_rate=0.1,
            mask_ratio=0.0):
    """The ViT symbol: input `data` (N, 3, image_size, image_size) raw RGB pixels, output
    `embeddings` (N, embedding_size). `dropout` must be 0 (arcface_torch's ViTs have none before
    the embedding); float32 only."""
    if dtype != 'float32':
        raise ValueError('the ViT networks are float32 only, got dtype %r' % (dtype,))
    if dropout:
        raise ValueError('the ViT networks take no dropout before the embedding (they use drop path), got %r'
                         % (dropout,))
    check_args(embedding_size, image_size, dtype, dropout)     # a positive multiple of 16: at least one token
    count = tokens(image_size)
    patches = mx.sym.Convolution(input_data(dtype), num_filter=width, kernel=(PATCH, PATCH), stride=(PATCH, PATCH),
                                 name='patch_embed')                                    # (N, W, h, w)
    body = mx.sym.transpose(mx.sym.reshape(patches, (0, 0, -1)), (0, 2, 1))          # (N, L, W)
    position = mx.sym.Variable('pos_embed', shape=(1, count, width), init=mx.init.Normal(0.02))
    # broadcast along the batch only: an input of another size (fewer tokens) is a shape error,
    # not a position embedding spread over a single token (tools infer the side from the params)
    body = body + mx.sym.broadcast_like(position, body, lhs_axes=(0,), rhs_axes=(0,))
    keep = keep_mask(body, mask_ratio) if mask_ratio > 0 else None
    key_bias = None if keep is None else mx.sym.repeat(
        mx.sym.transpose((keep - 1) * -LEFT_OUT_SCORE, (0, 2, 1)), repeats=HEADS, axis=0)   # (N H, 1, L)
    for index in range(depth):
        rate = drop_rate * index / (depth - 1) if depth > 1 else 0.0
        body = block(body, 'block%d' % index, width, count, rate, key_bias)
    body = layer_norm(body, 'norm', width)
    if keep is not None:          # the left-out tokens become the mask token
        mask_token = mx.sym.Variable('mask_token', shape=(1, 1, width), init=mx.init.Normal(0.02))
        body = mx.sym.broadcast_mul(body, keep) + mx.sym.broadcast_mul(1 - keep, mask_token)
    body = mx.sym.FullyConnected(mx.sym.reshape(body, (0, -1)), num_hidden=width, no_bias=True, name='feature_fc')
    body = mx.sym.BatchNorm(body, eps=HEAD_BN_EPS, momentum=BN_MOMENTUM, fix_gamma=False, name='feature_bn')
    body = mx.sym.FullyConnected(body, num_hidden=int(embedding_size), no_bias=True, name='embedding_fc')
    return mx.sym.BatchNorm(body, eps=HEAD_BN_EPS, momentum=BN_MOMENTUM, fix_gamma=False, name='embeddings')


def arcface_torch_layers(name):
    """[(our layer, its module in arcface_torch's vit.py, kind)]."""
    depth = CONFIGS[name][1]
    found = [('patch_embed', 'patch_embed.proj', 'conv_bias'), ('pos_embed', 'pos_embed', 'parameter')]
    for index in range(depth):
        ours, theirs = 'block%d' % index, 'blocks.%d' % index
        found += [(ours + '_norm1', theirs + '.norm1', 'layer_norm'),
                  (ours + '_attn_qkv', theirs + '.attn.qkv', 'fc_no_bias'),
                  (ours + '_attn_proj', theirs + '.attn.proj', 'fc'),
                  (ours + '_norm2', theirs + '.norm2', 'layer_norm'),
                  (ours + '_fc1', theirs + '.mlp.fc1', 'fc'), (ours + '_fc2', theirs + '.mlp.fc2', 'fc')]
    return found + [('norm', 'norm', 'layer_norm'), ('feature_fc', 'feature.0', 'fc_no_bias'),
                    ('feature_bn', 'feature.1', 'bn'), ('embedding_fc', 'feature.2', 'fc_no_bias'),
                    ('embeddings', 'feature.3', 'bn'),
                    ('mask_token', 'mask_token', 'parameter' if CONFIGS[name][3] > 0 else 'unused')]


def _build(name, embedding_size, image_size, dtype, dropout):
    width, depth, drop_rate, mask_ratio = CONFIGS[name]
    return get_vit(embedding_size, image_size, dtype, dropout, width, depth, drop_rate, mask_ratio)


NETWORKS = {name: Network(name, 'vit', entry.shape, _build, arcface_torch_layers, torch_init='vit_trunc_normal',
                          onednn_extra=entry.onednn_extra)
            for name, entry in catalog.of_family('vit').items()}
