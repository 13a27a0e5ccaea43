"""A trained backbone on disk: find it, load it for the tools (verify, embed, export), load
its weights alone for fine-tuning (train.py --pretrained); saved parameters are compared with
a network by checkpoint/layout.py's param_differences.

A model spec `PREFIX[,EPOCH]` names what mx.model.load_checkpoint(PREFIX, EPOCH) reads:
PREFIX-symbol.json and PREFIX-EPOCH.params (EPOCH printed with at least 4 digits). PREFIX
may also be a directory:
    a checkpoint dir `step-XXXXXXXX/`     its `model` prefix (checkpoint/layout.py)
    a models root                          its newest complete checkpoint, or with EPOCH the
                                           complete step-<EPOCH>/
Without EPOCH the largest one found for the prefix is used. `.partial` directories are never used.

Models from elsewhere (insightface's model zoo, the original MXNet toolkit) load too:
- the embedding output is found by name: sample_fc's `embeddings_output`, else insightface's
  `fc1_output`, else the graph's only output, or any layer named with --output;
- the tools feed raw RGB pixels 0..255. A graph that normalises its input itself (its data
  first meets a scalar or broadcast arithmetic op, or a BatchNorm) takes them as they are; for
  one whose data goes straight into a layer, the tools prepend (x - 127.5) / 128, the
  normalisation insightface's models were trained with (--normalize overrides the guess);
- --pretrained maps the parameters of a backbone with this run's architecture under other
  names by structure (structural_map), and names what did not map.
A path ending in .pth or .pt is insightface arcface_torch's backbone.pth (a PyTorch state dict,
read without running pickle code): torch_backbone maps it onto the network it holds (--network,
or the one whose shapes fit), arcface_torch's input normalisation included.
A path ending in .onnx is an ONNX model (onnx_model): the tools run it with onnxruntime (its
input size from the graph, its normalisation by onnx_model's rule); --pretrained loads its
initializers by name (our own exports) or by structure (_onnx_pretrained).
"""
import difflib
import json
import os
import re
from dataclasses import dataclass
from typing import Optional

import mxnet as mx
import numpy as np

from .. import symbols
from ..symbols.common import fixes_gamma
from .. import checkpoint
from . import onnx_model, torch_backbone
from ..data.mxnet_files import ndarray_file_problem, symbol_file_problem
from ..data.weight_values import implausible_values
from ..errors import MissingFileError, UsageError, mxnet_reason

IMAGE_SIZES = tuple(range(16, 513, 16))              # sides tried when inferring the input size
TORCH_SUFFIXES = (".pth", ".pt")                     # a PyTorch state dict (torch_backbone)
EMBEDDING_OUTPUTS = ("embeddings_output", "fc1_output")   # sample_fc's, insightface's MXNet models'
NORMALIZE_CHOICES = ("auto", "graph", "tool")        # who turns raw pixels into (x - 127.5) / 128
# ops that, meeting the data first, mean the graph scales its input itself
INPUT_SCALING_OPS = ("_minus_scalar", "_plus_scalar", "_mul_scalar", "_div_scalar", "_rminus_scalar",
                     "broadcast_sub", "broadcast_minus", "broadcast_add", "broadcast_plus", "broadcast_mul",
                     "broadcast_div", "elemwise_sub", "elemwise_mul", "BatchNorm")


@dataclass
class LoadedModel:
    symbol: mx.sym.Symbol       # single output: the embeddings (N, D); an onnx_model.OnnxGraph for .onnx
    arg_params: dict            # name -> mx.nd.NDArray, only those the symbol uses
    aux_params: dict
    prefix: str
    epoch: int
    image_size: int             # side of the square input the params fit
    config: Optional[dict]      # training config from the checkpoint's state.json, if any
    output: str = "embeddings_output"   # the graph output used as the embedding
    input_note: str = "the graph normalises raw pixels"   # who normalises the input
    weights_file: Optional[str] = None    # a .pth read instead of PREFIX-EPOCH.params
    source: str = ""                      # what the weights file holds, e.g. " (arcface_torch r50, ...)"

    @property
    def params_file(self):
        return self.weights_file or "%s-%04d.params" % (self.prefix, self.epoch)

    def line(self):
        """One line saying what was loaded and how it is fed (the tools print it)."""
        return (f"model {self.params_file}{self.source}: output {self.output}, input "
                f"{self.image_size}x{self.image_size} RGB 0..255, {self.input_note}")


def parse_model_spec(spec):
    """'PREFIX[,EPOCH]' -> (PREFIX, EPOCH or None)."""
    prefix, comma, epoch = spec.rpartition(",")
    if comma and re.fullmatch(r"\d+", epoch.strip()):
        return prefix, int(epoch)
    return spec, None


def resolve_prefix(path, epoch=None):
    """A load_checkpoint prefix from a prefix, a checkpoint dir or a models root (there the
    checkpoint of step `epoch`, or the newest)."""
    if os.path.isfile(path + "-symbol.json"):
        return path
    if not os.path.isdir(path):
        raise MissingFileError(f"--model {path}: neither {path}-symbol.json nor a directory exists")
    if path.rstrip(os.sep).endswith(checkpoint.PARTIAL_SUFFIX):
        raise UsageError(f"--model {path}: an incomplete checkpoint (.partial); use a complete one")
    if os.path.isfile(checkpoint.symbol_path(path)):
        return checkpoint.model_prefix(path)
    return checkpoint.model_prefix(checkpoint.find_checkpoint(path, epoch, option="--model"))


def available_epochs(prefix):
    folder, base = os.path.split(prefix)
    pattern = re.compile(re.escape(base) + r"-(\d+)\.params$")
    names = os.listdir(folder or ".")
    return sorted(int(m.group(1)) for m in map(pattern.match, names) if m)


def _read_saved(read, path, option, spec):
    """read(path) (mx.sym.load or mx.nd.load), the file checked first (data.mxnet_files: MXNet's
    C++ loaders trust its sizes); UsageError with the reason (for MXNet's, the last line of its
    message, after its C++ traceback) when the file is damaged, offering the previous complete
    checkpoint of its models root, as --resume would fall back to it."""
    check = ndarray_file_problem if read is mx.nd.load else symbol_file_problem
    reason = check(path)
    if reason is None:
        try:
            return read(path)
        except mx.base.MXNetError as err:
            reason = mxnet_reason(err)
        except UnicodeDecodeError:           # MXNet's message about the file is not UTF-8
            reason = "MXNet cannot parse it"
    previous = checkpoint.previous_checkpoint(os.path.dirname(path))
    offer = (f"; the previous complete checkpoint is {previous[1]}: {option} "
             f"{checkpoint.models_root_of(previous[1])},{previous[0]}" if previous else "")
    raise UsageError(f"{option} {spec}: {path} is damaged ({reason}){offer}") from None


def _read_config(prefix):
    """The training config saved beside a checkpoint's prefix, or None (a plain MXNet model)."""
    folder = os.path.dirname(prefix)
    if not os.path.isfile(checkpoint.state_path(folder)):
        return None
    return checkpoint.read_state(folder, needs=()).get("config")


def embedding_output(symbol, symbol_file, output=None):
    """(symbol of the embedding output, its name): `output` (a layer or output name) when
    given, else the first of EMBEDDING_OUTPUTS the graph has, else its only output."""
    internals = symbol.get_internals()
    names = internals.list_outputs()
    if output:
        name = output if output in names else output + "_output"
        if name not in names:
            raise UsageError(f"--output {output}: {symbol_file} has no such output (its outputs: "
                             f"{', '.join(symbol.list_outputs())}; layers: {', '.join(_layer_names(names)[-8:])}, ...)")
        return internals[name], name
    for name in EMBEDDING_OUTPUTS:
        if name in names:
            return internals[name], name
    if len(symbol.list_outputs()) == 1:
        return symbol, symbol.list_outputs()[0]
    raise UsageError(f"{symbol_file}: found outputs {symbol.list_outputs()} and none named "
                     f"{' or '.join(EMBEDDING_OUTPUTS)}; name the embedding layer with --output NAME")


def _layer_names(output_names):
    return [name[:-len("_output")] for name in output_names if name.endswith("_output")]


def normalizes_input(symbol):
    """Whether the graph scales its `data` itself: some op of INPUT_SCALING_OPS consumes it."""
    nodes = json.loads(symbol.tojson())["nodes"]
    data = [i for i, node in enumerate(nodes) if node["op"] == "null" and node["name"] == "data"]
    consumers = [node["op"] for node in nodes if any(entry[0] in data for entry in node.get("inputs", []))]
    return any(op in INPUT_SCALING_OPS for op in consumers)


def fed_raw_pixels(symbol, normalize="auto"):
    """(symbol that takes raw pixels 0..255, a note saying who normalises them). normalize:
    auto (normalizes_input decides), graph (the graph does), tool ((x - 127.5) / 128 is
    prepended)."""
    if normalize not in NORMALIZE_CHOICES:
        raise UsageError(f"--normalize must be one of {', '.join(NORMALIZE_CHOICES)}, got {normalize!r}")
    if normalize == "graph" or (normalize == "auto" and normalizes_input(symbol)):
        return symbol, "the graph normalises raw pixels" + (" (--normalize graph)" if normalize == "graph" else "")
    scaled = (mx.sym.Variable("data") - 127.5) * 0.0078125
    return symbol(data=scaled), ("(x - 127.5) / 128 applied before the graph" +
                                 (" (--normalize tool)" if normalize == "tool" else
                                  ", which does not normalise its input (--normalize graph if it expects 0..255)"))


def params_fit(symbol, arg_params, aux_params, side):
    """Whether every parameter shape of `symbol` at input side `side` matches the params."""
    try:   # the _partial variant raises without printing every shape to stdout
        arg_shapes, _, aux_shapes = symbol.infer_shape_partial(data=(1, 3, side, side))
    except mx.base.MXNetError:
        return False                   # e.g. too small for the network's kernels
    got = dict(zip(symbol.list_arguments(), arg_shapes))
    got.update(zip(symbol.list_auxiliary_states(), aux_shapes))
    return all(tuple(got[n]) == params[n].shape
               for params in (arg_params, aux_params) for n in params)


def infer_image_size(symbol, arg_params, aux_params):
    """The one side in IMAGE_SIZES at which the params fit `symbol` (the embedding FC's input
    width fixes it for the project's backbones); UsageError if none or several do."""
    fits = [side for side in IMAGE_SIZES if params_fit(symbol, arg_params, aux_params, side)]
    if len(fits) != 1:
        raise UsageError(f"cannot infer the input size from the params (sides that fit among "
                         f"{IMAGE_SIZES[0]}..{IMAGE_SIZES[-1]}: {fits or 'none'}); pass --image-size")
    return fits[0]


def is_torch_file(path):
    return path.lower().endswith(TORCH_SUFFIXES)


def _torch_file(spec, option, is_kind=is_torch_file, kind=".pth"):
    """The path of a .pth/.pt spec (or of `kind` by is_kind; UsageError if it names an epoch), else None."""
    path, epoch = parse_model_spec(spec)
    if not is_kind(path):
        return None
    if epoch is not None:
        raise UsageError(f"{option} {spec}: a {kind} file holds one set of weights; name the file without ',{epoch}'")
    return path


def check_finite(params, path, option):
    """UsageError naming the first parameter of `params` ({name: NDArray or array}) that holds a
    NaN, an infinity or an implausible magnitude (data.weight_values): a trained network never
    does, so the file is damaged (or its run diverged)."""
    for name, value in params.items():
        values = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        problem = implausible_values(values)
        if problem:
            raise UsageError(f"{option} {path}: {name} holds {problem}: the file is damaged, or the run that "
                             f"wrote it diverged")


def load_onnx_model(path, image_size=None, output=None, normalize="auto", network=None):
    """LoadedModel of an ONNX file: its symbol an onnx_model.OnnxGraph (onnxruntime), no params."""
    if network is not None:
        raise UsageError(f"--network {network}: only for a .pth model (an ONNX file's graph is its network)")
    graph, side, output, note = onnx_model.load(path, image_size, output, normalize)
    return LoadedModel(graph, {}, {}, path, 0, side, None, output, note, weights_file=path,
                       source=" (ONNX, onnxruntime on the CPU)")


def load_torch_model(path, image_size=None, output=None, normalize="auto", network=None):
    """LoadedModel of arcface_torch's backbone.pth at `path` (torch_backbone): our network's
    symbol with the file's weights, taking raw pixels as every model here does."""
    if normalize == "tool":
        raise UsageError(f"--normalize tool: the network built from {path} normalises raw pixels itself, "
                         f"as arcface_torch does ((x - 127.5) / 127.5); omit --normalize")
    backbone = torch_backbone.load(path, network, "--model")
    check_finite({**backbone.arg_params, **backbone.aux_params}, path, "--model")
    if image_size is not None and image_size != backbone.image_size:
        raise UsageError(f"--image-size {image_size}: {path} ({backbone.network}) fits "
                         f"{backbone.image_size}x{backbone.image_size} inputs; omit --image-size")
    symbol = symbols.get_symbol(backbone.network, backbone.embedding_size, backbone.image_size)
    symbol, output = embedding_output(symbol, path, output)
    arg_params = {n: backbone.arg_params[n] for n in symbol.list_arguments() if n != "data"}
    aux_params = {n: backbone.aux_params[n] for n in symbol.list_auxiliary_states()}
    return LoadedModel(symbol, arg_params, aux_params, path, 0, backbone.image_size, None, output,
                       "the graph normalises raw pixels to (x - 127.5) / 127.5 as arcface_torch does",
                       weights_file=path, source=f" (arcface_torch {backbone.network}: {backbone.how})")


def load_model(spec, image_size=None, output=None, normalize="auto", network=None):
    """LoadedModel from a --model spec (output: --output, normalize: --normalize, see above;
    network: --network, for a .pth only); errors (MissingFileError, UsageError) name the path."""
    torch_file = _torch_file(spec, "--model")
    if torch_file:
        return load_torch_model(torch_file, image_size, output, normalize, network)
    onnx_file = _torch_file(spec, "--model", onnx_model.is_onnx_file, ".onnx")
    if onnx_file:
        return load_onnx_model(onnx_file, image_size, output, normalize, network)
    if network is not None:
        raise UsageError(f"--network {network}: only for a .pth model (an MXNet model's symbol is its network)")
    path, epoch = parse_model_spec(spec)
    prefix = resolve_prefix(path, epoch)
    if epoch is None:
        epochs = available_epochs(prefix)
        if not epochs:
            raise MissingFileError(f"--model {spec}: no {prefix}-NNNN.params next to {prefix}-symbol.json")
        epoch = epochs[-1]
    params_file = "%s-%04d.params" % (prefix, epoch)
    if not os.path.isfile(params_file):
        raise MissingFileError(f"--model {spec}: {params_file} does not exist "
                                f"(epochs there: {available_epochs(prefix) or 'none'})")
    symbol = _read_saved(mx.sym.load, prefix + "-symbol.json", "--model", spec)      # as load_checkpoint,
    saved = _read_saved(mx.nd.load, params_file, "--model", spec)                     # naming the bad file
    arg_params = {name[4:]: value for name, value in saved.items() if name.startswith("arg:")}
    aux_params = {name[4:]: value for name, value in saved.items() if name.startswith("aux:")}
    symbol, output = embedding_output(symbol, prefix + "-symbol.json", output)
    symbol, input_note = fed_raw_pixels(symbol, normalize)
    missing = [n for n in symbol.list_arguments() if n != "data" and n not in arg_params]
    missing += [n for n in symbol.list_auxiliary_states() if n not in aux_params]
    if missing:
        raise UsageError(f"{params_file} lacks parameters of the symbol: {', '.join(missing[:10])}")
    arg_params = {n: arg_params[n] for n in symbol.list_arguments() if n != "data"}
    aux_params = {n: aux_params[n] for n in symbol.list_auxiliary_states()}
    check_finite({**arg_params, **aux_params}, params_file, "--model")
    if image_size is None:
        image_size = infer_image_size(symbol, arg_params, aux_params)
    elif image_size <= 0 or not params_fit(symbol, arg_params, aux_params, image_size):
        raise UsageError(f"--image-size {image_size}: the params of {params_file} do not fit "
                         f"{image_size}x{image_size} inputs; omit --image-size to infer it")
    return LoadedModel(symbol, arg_params, aux_params, prefix, epoch, image_size, _read_config(prefix),
                       output, input_note)


def load_pretrained(spec, symbol, image_size, network, note=lambda line: None):
    """(arg_params, aux_params) of a trained backbone for fine-tuning (_load_pretrained), every
    value finite (check_finite)."""
    arg_params, aux_params = _load_pretrained(spec, symbol, image_size, network, note)
    check_finite({**arg_params, **aux_params}, spec, "--pretrained")
    return arg_params, aux_params


def _load_pretrained(spec, symbol, image_size, network, note):
    """(arg_params, aux_params) of a trained backbone for fine-tuning: `spec` is PREFIX[,EPOCH]
    (as mx.model.load_checkpoint), a checkpoint dir or a models root. Only the .params file
    (MXNet's NDArray format, never the optimizer state) and the symbol JSON are read. Params
    named as this run's `symbol` names them load by name; params that lack some of its names
    (another toolkit's naming) are matched by structure (structural_map; note(line) says how).
    UsageError naming the layer when they do not fit. A .pth is arcface_torch's state dict
    (torch_backbone), read as this run's `network`; a .onnx an ONNX graph (_onnx_pretrained)."""
    if _torch_file(spec, "--pretrained"):
        return _torch_pretrained(spec, symbol, image_size, network, note)
    if _torch_file(spec, "--pretrained", onnx_model.is_onnx_file, ".onnx"):
        return _onnx_pretrained(spec, symbol, image_size, network, note)
    path, epoch = parse_model_spec(spec)
    prefix = resolve_prefix(path, epoch)
    epoch = epoch if epoch is not None else (available_epochs(prefix) or [None])[-1]
    params = f"{prefix}-{epoch:04d}.params" if epoch is not None else f"{prefix}-NNNN.params"
    if not os.path.isfile(params):
        raise MissingFileError(f"--pretrained {spec}: {params} does not exist")
    loaded = _read_saved(mx.nd.load, params, "--pretrained", spec)
    differences = checkpoint.param_differences(loaded, symbol, image_size)
    if any(line.endswith(" is missing") for line in differences):      # named otherwise
        source = _read_saved(mx.sym.load, prefix + "-symbol.json", "--pretrained", spec)
        return structural_map(spec, loaded, source, symbol, image_size, network, note)
    if differences:
        raise UsageError(f"--pretrained {spec} does not fit this run's network {network!r} at "
                         f"{image_size} px: {differences[0]} ({len(differences)} differences)")
    return ({k[4:]: v for k, v in loaded.items() if k.startswith("arg:")},
            {k[4:]: v for k, v in loaded.items() if k.startswith("aux:")})


def _torch_pretrained(spec, symbol, image_size, network, note):
    """(arg_params, aux_params) for `symbol` from arcface_torch's backbone.pth `spec`."""
    backbone = torch_backbone.load(spec, network, "--pretrained")
    loaded = {f"arg:{k}": v for k, v in backbone.arg_params.items()}
    loaded.update({f"aux:{k}": v for k, v in backbone.aux_params.items()})
    differences = checkpoint.param_differences(loaded, symbol, image_size)
    if differences:
        raise UsageError(f"--pretrained {spec} (arcface_torch's {network}, embedding size "
                         f"{backbone.embedding_size}, {backbone.image_size} px) does not fit this run's network "
                         f"{network!r} at {image_size} px: {differences[0]} ({len(differences)} differences)")
    note(f"--pretrained {spec}: arcface_torch's {network}, {len(loaded)} parameters by name "
         f"(its input normalisation and its features BatchNorm's scale folded in)")
    return backbone.arg_params, backbone.aux_params


def _onnx_pretrained(spec, symbol, image_size, network, note):
    """(arg_params, aux_params) for `symbol` from the initializers of the ONNX graph `spec`: by
    name when it has every one of ours (tools.export's files), else by structure (structural_map
    over onnx_model.weights), its input normalisation folded into the stem conv as torch_backbone
    does. UsageError, one line, when the graph does not map onto this run's network."""
    model = onnx_model.read_graph(spec, "--pretrained")
    roles, arrays = onnx_model.weights(model)
    aux = set(symbol.list_auxiliary_states())
    ours = [n for n in symbol.list_arguments() if n != "data"] + sorted(aux)
    if all(name in arrays for name in ours):
        loaded = {("aux:" if n in aux else "arg:") + n: mx.nd.array(arrays[n]) for n in ours}
        differences = checkpoint.param_differences(loaded, symbol, image_size)
        if differences:
            raise UsageError(f"--pretrained {spec}: the ONNX graph does not map onto this run's network "
                             f"{network!r} at {image_size} px: {differences[0]} ({len(differences)} differences)")
        note(f"--pretrained {spec}: ONNX initializers, {len(loaded)} parameters by name")
        return ({k[4:]: v for k, v in loaded.items() if k.startswith("arg:")},
                {k[4:]: v for k, v in loaded.items() if k.startswith("aux:")})
    scaling = onnx_model.input_normalization(model)
    if scaling is None or scaling[0] != 127.5:
        raise UsageError(f"--pretrained {spec}: the ONNX graph's input normalisation is not (x - 127.5) * s "
                         f"(found {scaling or 'another start'}), so it does not map onto network {network!r}, "
                         f"which computes on (x - 127.5) / 128")
    loaded = {"arg:" + name: mx.nd.array(value) for name, value in arrays.items()}
    why = ("; its convolutions carry biases (BatchNorm folded into them at export, e.g. torch.onnx's constant "
           "folding), which our networks' do not" if onnx_model.has_conv_biases(model) else "")
    try:
        arg_params, aux_params = structural_map(spec, loaded, roles, symbol, image_size, network, note)
    except UsageError as err:
        raise UsageError(str(err).replace("names its parameters otherwise and does not fit",
                                          "(ONNX) does not map onto", 1)
                         .replace(" by structure either", " by the order and shapes of its weights", 1) + why) from None
    target = parameter_roles(symbol)
    scaled = [name for name, role, attrs in target if role == "bn gamma" and fixes_gamma(attrs)
              and (arg_params[name] != 1).sum().asscalar() > 0]
    if scaled:
        raise UsageError(f"--pretrained {spec}: the ONNX graph's BatchNorm mapped onto {scaled[0]} has a learned "
                         f"scale where network {network!r} holds it at 1, so it does not map onto it")
    stem = next(name for name, role, _ in target if role == "conv weight")
    if scaling[1] != 1 / 128:                 # the graph computes on (x - 127.5) * s, ours on / 128
        arg_params[stem] = arg_params[stem] * (scaling[1] * 128)
        note(f"--pretrained {spec}: its input scale {scaling[1]:.6g} folded into {stem}")
    return arg_params, aux_params


# The role of a variable by the op that consumes it and its position among that op's inputs.
INPUT_ROLES = {"Convolution": ("data", "conv weight", "conv bias"),
               "FullyConnected": ("data", "fc weight", "fc bias"),
               "BatchNorm": ("data", "bn gamma", "bn beta", "bn mean", "bn var"),
               "LeakyReLU": ("data", "prelu slope")}


def parameter_roles(symbol):
    """[(name, role, attrs of the op it feeds)] of the symbol's parameters and aux states in
    graph order. A Convolution whose weight is `*_gamma` is symbols.common.prelu's slope (role
    "prelu slope")."""
    nodes = json.loads(symbol.tojson())["nodes"]
    roles, seen = [], set()
    for node in nodes:
        if node["op"] == "null":
            continue
        for position, (index, *_) in enumerate(node.get("inputs", [])):
            variable = nodes[index]
            name = variable["name"]
            if variable["op"] != "null" or name == "data" or name in seen:
                continue
            seen.add(name)
            known = INPUT_ROLES.get(node["op"], ())
            role = known[position] if position < len(known) else f"{node['op']} input {position}"
            if role == "conv weight" and name.endswith("_gamma"):
                role = "prelu slope"
            roles.append((name, role, node.get("attrs", {})))
    return roles


def _batch_norm_eps(attrs):
    return float(attrs.get("eps", 1e-3))                 # MXNet's BatchNorm default


def _carried_over(value, role, theirs, ours):
    """A source parameter as this network's layer must hold it to compute the same: a BatchNorm
    whose eps differs gets its moving variance shifted by the difference (var + eps is what
    inference divides by), and one whose gamma the source held fixed at 1 gets gamma 1."""
    if role == "bn var":
        return value + (_batch_norm_eps(theirs) - _batch_norm_eps(ours))
    if role == "bn gamma" and fixes_gamma(theirs) and not fixes_gamma(ours):
        return mx.nd.ones_like(value)
    return value


def _match_key(role, shape):
    """What must agree for two parameters to correspond: role and shape for weights, role and
    size for per-channel vectors (a PReLU slope is (C,) or (C, 1, 1, 1))."""
    if role in ("conv weight", "fc weight"):
        return role, tuple(shape)
    size = 1
    for side in shape:
        size *= side
    return role, size


def structural_map(spec, loaded, source_symbol, symbol, image_size, network, note):
    """(arg_params, aux_params) for `symbol` from params `loaded` of `source_symbol` (or its
    parameter_roles list), a network of the same architecture under other names: both graphs' parameters in graph order,
    aligned by role and shape (difflib). Every parameter of `symbol` must find one; the
    source's left over (a training head, a bias our layer lacks) are named in note(line)."""
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(1, 3, image_size, image_size))
    ours = dict(zip(symbol.list_arguments(), arg_shapes))
    ours.update(zip(symbol.list_auxiliary_states(), aux_shapes))
    saved = {name[4:]: array for name, array in loaded.items()}
    source_roles = source_symbol if isinstance(source_symbol, list) else parameter_roles(source_symbol)
    source = [entry for entry in source_roles if entry[0] in saved]
    target = parameter_roles(symbol)
    matcher = difflib.SequenceMatcher(None, [_match_key(role, saved[name].shape) for name, role, _ in source],
                                      [_match_key(role, ours[name]) for name, role, _ in target], autojunk=False)
    pairs = [(source[block.a + k], target[block.b + k])
             for block in matcher.get_matching_blocks() for k in range(block.size)]
    mapped = {our[0]: theirs[0] for theirs, our in pairs}
    unmatched = [name for name, _, _ in target if name not in mapped]
    if unmatched:
        first = unmatched[0]
        raise UsageError(f"--pretrained {spec} names its parameters otherwise and does not fit this run's network "
                         f"{network!r} at {image_size} px by structure either: {len(unmatched)} of its "
                         f"{len(target)} parameters have no counterpart, the first {first} {tuple(ours[first])}")
    used = set(mapped.values())
    unused = [name for name, _, _ in source if name not in used]
    note(f"--pretrained {spec}: parameters named otherwise, matched by structure: {len(pairs)} "
         f"({pairs[0][0][0]} -> {pairs[0][1][0]}, ..., {pairs[-1][0][0]} -> {pairs[-1][1][0]}); not used: "
         f"{', '.join(unused) if unused else 'none'}")
    aux = set(symbol.list_auxiliary_states())
    weights = {our: _carried_over(saved[theirs].reshape(tuple(ours[our])), role, their_attrs, our_attrs)
               for (theirs, _, their_attrs), (our, role, our_attrs) in pairs}
    return ({k: v for k, v in weights.items() if k not in aux}, {k: v for k, v in weights.items() if k in aux})
