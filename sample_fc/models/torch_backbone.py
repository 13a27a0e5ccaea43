"""insightface arcface_torch's backbones (a `backbone.pth` state dict, read by torch_weights)
as sample_fc's networks: which of our parameters each tensor is, which network a file holds,
and its weights as our symbol's (arg, aux) params computing arcface_torch's embeddings.

symbols/iresnet.py and symbols/mobilefacenet.py are arcface_torch's iresnet and MobileFaceNet
layer for layer; each network's descriptor (symbols.network(name).arcface_torch_layers(), written
in its family file) names each of our layers' arcface_torch module, and PARAMS each parameter:
conv/FC weight, bias <- weight, bias; BatchNorm gamma, beta, moving_mean, moving_var (aux) <-
weight, bias, running_mean, running_var (num_batches_tracked is dropped); a PReLU slope (C, 1, 1, 1)
<- weight (C,). A DataParallel "module." prefix is ignored.

Two folds make our network compute arcface_torch's from the same raw pixels (exact math):
- arcface_torch feeds (x / 255 - 0.5) / 0.5 = (x - 127.5) / 127.5, our graph (x - 127.5) / 128:
  the stem conv's weight (no bias, zero padding) is multiplied by INPUT_SCALE = 128 / 127.5;
  (a ViT: its patch convolution's weight; no padding, so its bias stays);
- our BatchNorm `embeddings` holds its scale at 1 (fix_gamma), arcface_torch's `features`
  BatchNorm1d has one (mbf learns it; iresnet's stays 1): with gamma g, the FC's weight and
  bias and the moving mean are multiplied by g, which at inference is the same function (a ViT's
  `embeddings` learns its scale, as arcface_torch's feature.3 does: nothing to fold).
A ViT also has a LayerNorm kind (gamma, beta <- weight, bias), its position embedding (a bare
parameter, `pos_embed` <- pos_embed) and arcface_torch's mask token (`mask_token`, for the
networks with patch masking; the `_mask0` ones read it and have no use for it).
"""
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from .. import symbols
from ..symbols import common, iresnet, vit
from ..errors import UsageError
from .torch_weights import read_state_dict

INPUT_SCALE = 128 / 127.5
PARAMS = {"conv": (("weight", "weight"),),
          "conv_bias": (("weight", "weight"), ("bias", "bias")),
          "fc": (("weight", "weight"), ("bias", "bias")),
          "fc_no_bias": (("weight", "weight"),),
          "bn": (("gamma", "weight"), ("beta", "bias"), ("moving_mean", "running_mean"), ("moving_var", "running_var")),
          "layer_norm": (("gamma", "weight"), ("beta", "bias")),
          "prelu": (("gamma", "weight"),),
          "parameter": (("", ""),),     # a bare nn.Parameter: our variable and its key are the layer's names
          "unused": ()}                 # a tensor of the file that our network has no use for (ViT's mask token)
FIRST_CONV = ("stem_conv", "patch_embed")    # the layer that takes the pixels (iresnet and mbf's; ViT's)


def layers(network):
    """[(our layer, its arcface_torch module, kind of PARAMS)] of `network`, in order (the
    network's descriptor: symbols/<family>.py arcface_torch_layers)."""
    return symbols.network(network).arcface_torch_layers()


def parameter_names(network):
    """[(our parameter, its state dict key, kind)] of `network`, in order."""
    return [(f"{ours}_{mine}" if mine else ours, f"{theirs}.{its}" if its else theirs, kind)
            for ours, theirs, kind in layers(network) for mine, its in PARAMS[kind]]


def unused_keys(network):
    """The state dict keys of `network`'s file that it loads nothing from."""
    return {theirs for _, theirs, kind in layers(network) if kind == "unused"}


@dataclass
class TorchBackbone:
    network: str
    embedding_size: int
    image_size: int
    arg_params: dict     # name -> mx.nd.NDArray, folded (module docstring)
    aux_params: dict
    how: str             # how the network was chosen


def _differences(state, network):
    """(how many tensors differ, the first difference, or None; (D, side) when they all fit)."""
    names = parameter_names(network)
    wanted = {theirs for _, theirs, _ in names}
    missing = [theirs for _, theirs, _ in names if theirs not in state]
    extra = [key for key in state
             if key not in wanted | unused_keys(network) and not key.endswith(".num_batches_tracked")]
    if missing or extra:
        first = f"{missing[0]} is missing" if missing else f"{extra[0]} is not in {network}"
        return len(missing) + len(extra), first, None
    layer = {ours: theirs for ours, theirs, _ in layers(network)}
    sizes = _sizes(state, layer)
    if isinstance(sizes, str):
        return 1, sizes, None
    embedding_size, side = sizes
    symbol = symbols.get_symbol(network, embedding_size, side)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, side, side))
    shapes = dict(zip(symbol.list_arguments() + symbol.list_auxiliary_states(), arg_shapes + aux_shapes))
    if sorted(shapes) != sorted(["data"] + [ours for ours, _, _ in names]):
        raise AssertionError(f"torch_backbone.layers({network!r}) does not name the symbol's parameters")
    want = {ours: tuple(shapes[ours][:1] if kind == "prelu" else shapes[ours]) for ours, _, kind in names}
    wrong = [f"{theirs} has shape {state[theirs].shape}, {network} needs {want[ours]}"
             for ours, theirs, _ in names if state[theirs].shape != want[ours]]
    return len(wrong), (wrong[0] if wrong else None), sizes


def _sizes(state, layer):
    """(embedding size, input side) the file's embedding FC (and GDC, or a ViT's position
    embedding) imply, or why none."""
    fc = layer["embedding_fc"] + ".weight"
    if state[fc].ndim != 2 or 0 in state[fc].shape:
        return f"{fc} has shape {state[fc].shape}, not (embedding size, features)"
    embedding_size, features = state[fc].shape
    if "pos_embed" in layer:      # a ViT: one position per token; the side whose patches give that many
        count = state["pos_embed"].shape[1] if state["pos_embed"].ndim == 3 else 0
        side = -(-int(round(count ** 0.5)) * vit.PATCH // common.DOWNSAMPLE) * common.DOWNSAMPLE
        if not count or vit.tokens(side) != count:
            return f"pos_embed has shape {state['pos_embed'].shape}, which fits no input size"
        return int(embedding_size), side
    if "gdc_conv" in layer:       # the GDC's kernel is the final map's side
        key = layer["gdc_conv"] + ".weight"
        side = state[key].shape[-1] if state[key].ndim == 4 else 0
    else:                         # the FC takes the final map, 512 x side x side
        key, side = fc, int(round((features / iresnet.STAGE_CHANNELS[-1]) ** 0.5))
        side = side if iresnet.STAGE_CHANNELS[-1] * side * side == features else 0
    if not side:
        return f"{key} has shape {state[key].shape}, which fits no input size"
    return int(embedding_size), int(side) * common.DOWNSAMPLE


def _folded(state, network, symbol):
    """{our parameter: float32 array} with the folds of the module docstring (`symbol`: the
    network's, which says whether its embedding BatchNorm learns its scale)."""
    weights = {ours: state[theirs].astype(np.float32).reshape((-1, 1, 1, 1) if kind == "prelu" else state[theirs].shape)
               for ours, theirs, kind in parameter_names(network)}
    first = next(name for name in FIRST_CONV if f"{name}_weight" in weights)
    weights[f"{first}_weight"] *= INPUT_SCALE      # no padding: the bias stays
    if common.learns_embedding_scale(symbol):      # as arcface_torch's does (a ViT's): nothing to fold
        return weights
    scale = weights["embeddings_gamma"]
    weights["embedding_fc_weight"] *= scale[:, None]
    if "embedding_fc_bias" in weights:
        weights["embedding_fc_bias"] *= scale
    weights["embeddings_moving_mean"] *= scale
    weights["embeddings_gamma"] = np.ones_like(scale)
    return weights


def load(path, network=None, option="--model"):
    """TorchBackbone of the arcface_torch state dict at `path`: as `network` (one of
    symbols.NETWORKS), or the one network whose parameter names and shapes the file's equal.
    UsageError (one line, naming the file) when the file cannot be read, does not hold
    `network`, or holds none or several of them (naming the closest and their first
    difference)."""
    if network is not None and network not in symbols.NETWORKS:
        raise UsageError(f"--network {network!r}: not one of {', '.join(symbols.NETWORKS)}")
    try:
        state = read_state_dict(path)
    except UsageError as err:           # MissingFileError stays one
        raise type(err)(f"{option} {err}") from None
    if state and all(key.startswith("module.") for key in state):      # saved from DataParallel
        state = {key[len("module."):]: value for key, value in state.items()}
    found = {name: _differences(state, name) for name in ([network] if network else symbols.NETWORKS)}
    fits = [name for name, (count, _, _) in found.items() if count == 0]
    if network and not fits:
        count, first, _ = found[network]
        raise UsageError(f"{option} {path} does not hold arcface_torch's {network}: {first} "
                         f"({count} tensors differ)")
    if len(fits) > 1:
        raise UsageError(f"{option} {path} fits several of sample_fc's networks ({', '.join(fits)}); "
                         f"name one with --network")
    if not fits:
        closest = sorted(found, key=lambda name: found[name][0])[:2]
        raise UsageError(f"{option} {path} holds none of sample_fc's networks; closest: " + "; ".join(
            f"{name} ({found[name][0]} tensors differ, first {found[name][1]})" for name in closest))
    name = fits[0]
    embedding_size, image_size = found[name][2]
    symbol = symbols.get_symbol(name, embedding_size, image_size)
    weights = {key: mx.nd.array(value) for key, value in _folded(state, name, symbol).items()}
    aux = {key: value for key, value in weights.items() if key.endswith(("_moving_mean", "_moving_var"))}
    return TorchBackbone(name, embedding_size, image_size, {k: v for k, v in weights.items() if k not in aux}, aux,
                         "--network" if network else "the one network whose shapes fit")
