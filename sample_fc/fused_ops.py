"""Our own MXNet operators (sample_fc/_mx_ops.cc, an MXNet operator library built by setup.py)
and the graph rewrite that puts them into a backbone for training on the CPU.

MXNet 1.9 has no fast CPU PReLU: symbols/common.py builds it from relu, clip, a depthwise 1x1
convolution and an add, which took ~40% of an mbf training step on the CPU (BENCHMARKS.md:
"Where a CPU step's time goes"). `fuse(symbol)` replaces each of those four-node groups by one
`sample_fc_prelu` node with the same inputs (the data and `<name>_gamma`) and the same name, so
parameters, checkpoints and every output are unchanged: forward values and the data gradient
are the same bits, the slopes' gradient the same sum in another order (float rounding).

MXNet 1.9 has no fast CPU kernel either for a grouped 3x3 convolution with 2 channels per
group (mbf's stem_dw_conv: 128 channels in 64 groups): it ran 4-7x slower than a depthwise
conv of the same size (one thread, forward + backward; ours is 3-7x faster than MXNet's at
16x16, 2.6-3x at 56x56). `fuse(symbol, data_shape)` replaces each such Convolution (kernel
3x3, stride 1, pad 1, no dilation, no bias, as many channels out as in, GROUP_CONV_WIDTHS
channels per group) by one `sample_fc_group_conv3x3` node with the same name and inputs (the
data and `<name>_weight`), so parameters and checkpoints are unchanged; outputs and gradients
are the same sums in another order (float rounding). Its input channels are not in the graph:
fuse finds them from the weight's shape, inferred from `data_shape`, and leaves the conv to
MXNet when it cannot. Depthwise convs (1 channel per group) keep MXNet's own fast kernel.

MXNet 1.9's CPU backward of LayerNorm is its generic reduction path: 16x its forward, a fifth of
a ViT's training step (vit_t 64 px, batch 32, one thread: 310-356 of 1,480-1,660 ms). `fuse` replaces each
LayerNorm over the last axis (the ViTs' every norm) whose mean and std outputs nothing reads by one
`sample_fc_layer_norm` node with the same name, inputs (data, `<name>_gamma`, `<name>_beta`) and
eps: the same function, its sums in another order (float rounding).

A ViT's attention (symbols/vit.py: a 5-D transpose of the fused qkv, splits, two batch_dots, a
softmax, transposes back) is a fifth of its step on the CPU: batch_dot loops one small sgemm per
sample and head. `fuse` replaces the nodes between each attention's named ends (ATTENTION_ENDS)
by one `sample_fc_attention` node reading the qkv projection (and the patch mask's key bias):
the same function, sums in another order.

MXNet 1.9's CPU clip branches per element, 3x slower on data of both signs than of one (a ViT
MLP's ReLU6 on centred pre-activations: a seventh of its step). `fuse` replaces every clip
outside a PReLU group by one `sample_fc_clip` node, the same name, input and bounds: the same
values and gradients, bit for bit.

The training module and the verification's embedder run the fused graph on CPU contexts
(builder.build_module, verification.Embedder). Saved
models keep the composite form (standard operators: any MXNet, ONNX export, insightface's
tools read them). Without the library (not built: no C++ compiler at `pip install -e .`)
`fuse` returns the symbol unchanged and says once that training is slower.
"""
import ctypes
import glob
import json
import logging
import os
import struct
import sys

import mxnet as mx
import numpy as np
from mxnet.base import _LIB, OpHandle, c_str, check_call, mx_uint
from mxnet.ndarray.register import _make_ndarray_function
from mxnet.symbol.register import _make_symbol_function

from .symbols.common import ATTENTION_ENDS, PRELU_PARTS, attr_ints

OP_NAME = "sample_fc_prelu"
CONV_OP_NAME = "sample_fc_group_conv3x3"
LAYER_NORM_OP_NAME = "sample_fc_layer_norm"
ATTENTION_OP_NAME = "sample_fc_attention"
CLIP_OP_NAME = "sample_fc_clip"
# channels per group (in and out) of the convs CONV_OP_NAME replaces: where it beat MXNet's
# Convolution (1 thread, fwd+bwd, batch 64 x 128 channels at 16x16 and 56x56; 4: 1.2-2.4x)
GROUP_CONV_WIDTHS = (2, 4)
_library = {}        # "loaded": whether this process's MXNet has the operators


def library_path():
    """The built operator library, or None."""
    found = sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_mx_ops*.so")))
    return found[0] if found else None


def available():
    """True when the operator library is built and loaded into this process's MXNet (loads it once)."""
    if "loaded" not in _library:
        path, reason = library_path(), "it is not built"
        if path and not whole_elf(path):            # dlopen of a cut-short library kills the process (SIGBUS)
            reason = f"{path} is damaged (shorter than its ELF headers say)"
        elif path:
            try:
                load_library(path)
                reason = None
            except mx.MXNetError as error:
                reason = f"{path} does not load: {str(error).strip().splitlines()[0]}"
        if reason:
            logging.getLogger(__name__).warning(
                "sample_fc's fused CPU operators are not available (%s): PReLU runs as four MXNet "
                "operators, mbf's grouped stem conv and a ViT's LayerNorms, attentions and ReLU6s as MXNet's, "
                "an mbf step on the CPU about twice as slow and a ViT's 1.5x "
                "(re-run scripts/bootstrap.sh, or pip install -e . with a C++ compiler)", reason)
        _library["loaded"] = reason is None
    return _library["loaded"]


def load_library(path):
    """Load the operator library into this process's MXNet and give its operators their
    `mx.nd.<name>` and `mx.sym.<name>` functions. mx.library.load does both by regenerating the
    functions of every registered operator (~2,200; most of a second of each worker's start);
    only ours are new. Training needs only the registration (fuse edits the graph's JSON)."""
    check_call(_LIB.MXLoadLib(c_str(path), mx_uint(0)))
    for name in (OP_NAME, CONV_OP_NAME, LAYER_NORM_OP_NAME, ATTENTION_OP_NAME, CLIP_OP_NAME):
        for namespace, make_function in (("ndarray", _make_ndarray_function), ("symbol", _make_symbol_function)):
            handle = OpHandle()
            check_call(_LIB.NNGetOpHandle(c_str(name), ctypes.byref(handle)))
            function = make_function(handle, name, name)
            function.__module__ = f"mxnet.{namespace}"
            for module in (sys.modules[f"mxnet.{namespace}.op"], sys.modules[f"mxnet.{namespace}"]):
                setattr(module, name, function)


def whole_elf(path):
    """Whether `path` is a 64-bit ELF file at least as long as its section header table's end."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(64)
        size = os.path.getsize(path)
    except OSError:
        return False
    if len(header) < 64 or header[:5] != b"\x7fELF\x02":
        return False
    section_offset, = struct.unpack_from("<Q", header, 0x28)
    entry_size, count = struct.unpack_from("<HH", header, 0x3A)
    return section_offset + entry_size * count <= size


def fuse(symbol, data_shape=None):
    """`symbol` with every PReLU of symbols.common.prelu as one sample_fc_prelu node, every
    grouped 3x3 conv of group_convs as one sample_fc_group_conv3x3 node, every LayerNorm of
    layer_norms as one sample_fc_layer_norm node, every ViT attention of attentions as one
    sample_fc_attention node and every other clip as one sample_fc_clip node; `symbol` itself
    when the library is not available, the symbol holds none of them, or not all of its
    parameters are float32 (a float16 backbone: the operators are float32 only). `data_shape`:
    the shape of its input `data` (unknown dimensions 0), which gives the convs' input channels;
    without it only convs whose weight shape the symbol itself tells are replaced."""
    graph = json.loads(symbol.tojson())
    replaced = {}
    for index, (data, gamma, inners) in prelu_groups(graph["nodes"]).items():
        replaced[index] = ({"op": OP_NAME, "inputs": [data, gamma]}, inners)
    for index, (data, weight, num_group) in group_convs(graph["nodes"], symbol, data_shape).items():
        replaced[index] = ({"op": CONV_OP_NAME, "attrs": {"num_group": str(num_group)}, "inputs": [data, weight]}, ())
    for index, eps in layer_norms(graph).items():
        inputs = graph["nodes"][index]["inputs"]
        replaced[index] = ({"op": LAYER_NORM_OP_NAME, "attrs": {"eps": eps}, "inputs": inputs}, ())
    for index, (qkv, key_bias, heads, inners) in attentions(graph).items():
        attrs = {"heads": str(heads), "key_bias": "1" if key_bias else "0"}
        inputs = [qkv] + ([key_bias] if key_bias else [])
        replaced[index] = ({"op": ATTENTION_OP_NAME, "attrs": attrs, "inputs": inputs}, inners)
    dropped = {inner for _, inners in replaced.values() for inner in inners}
    for index, node in enumerate(graph["nodes"]):
        if node["op"] == "clip" and index not in dropped:
            replaced[index] = ({"op": CLIP_OP_NAME, "attrs": clip_bounds(node), "inputs": node["inputs"]}, ())
    if not replaced or not all_float32(symbol) or not available():
        return symbol
    return mx.sym.load_json(json.dumps(rewrite(graph, replaced)))


def clip_bounds(node):
    """A clip node's a_min and a_max as sample_fc_clip's attributes (MXNet writes them as
    Python's float text: "6.0", "-inf")."""
    return {bound: node["attrs"][bound] for bound in ("a_min", "a_max")}


def all_float32(symbol):
    """Whether every argument and auxiliary state of `symbol` is float32 for float32 `data`."""
    try:
        arg_types, _, aux_types = symbol.infer_type_partial(data="float32")
    except mx.MXNetError:
        return False
    return arg_types is not None and all(t is not None and np.dtype(t) == np.float32
                                         for t in list(arg_types) + list(aux_types))


def prelu_groups(nodes):
    """{index of a PReLU's add node: (data entry, gamma entry, indices of its other three nodes)}
    for each PReLU built by symbols.common.prelu, found by its node names and wiring."""
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    groups = {}
    for index, node in enumerate(nodes):
        if node["op"] != "elemwise_add":
            continue
        part = {key: by_name.get(node["name"] + suffix) for key, suffix in PRELU_PARTS.items()}
        if None in part.values():
            continue
        relu, scaled, negative = nodes[part["relu"]], nodes[part["scaled"]], nodes[part["negative"]]
        data = negative["inputs"][0] if negative["op"] == "clip" else None
        if (relu["op"] != "relu" or scaled["op"] != "Convolution" or data is None
                or relu["inputs"] != [data] or [entry[0] for entry in node["inputs"]] != [part["relu"], part["scaled"]]
                or [entry[0] for entry in scaled["inputs"]] != [part["negative"], part["gamma"]]):
            continue
        groups[index] = (data, scaled["inputs"][1], (part["relu"], part["scaled"], part["negative"]))
    return groups


def group_convs(nodes, symbol, data_shape=None):
    """{index of a Convolution node: (data entry, weight entry, num_group)} for each conv
    sample_fc_group_conv3x3 computes: kernel 3x3, stride 1, pad 1, dilation 1, no bias,
    NCHW, num_group > 1 groups of GROUP_CONV_WIDTHS channels in and out. The input channels
    are not in the JSON: the weight variable's shape (num_filter, C_in / num_group, 3, 3)
    gives them, inferred from `data_shape` (the symbol's input `data`); a conv whose weight
    shape stays unknown is left out."""
    candidates = {}
    for index, node in enumerate(nodes):
        attrs = node.get("attrs", {})
        if node["op"] != "Convolution" or len(node["inputs"]) != 2:
            continue
        groups, filters = int(attrs.get("num_group", "1")), int(attrs.get("num_filter", "0"))
        if (attr_ints(attrs.get("kernel")) != (3, 3) or attr_ints(attrs.get("stride")) not in (None, (1, 1))
                or attr_ints(attrs.get("pad")) != (1, 1) or attr_ints(attrs.get("dilate")) not in (None, (1, 1))
                or attrs.get("no_bias", "False").lower() not in ("true", "1")
                or attrs.get("layout", "None") not in ("None", "NCHW")
                or groups < 2 or filters % groups or filters // groups not in GROUP_CONV_WIDTHS):
            continue
        weight = node["inputs"][1]
        if nodes[weight[0]]["op"] != "null":        # the weight's shape is known for variables only
            continue
        candidates[index] = (node["inputs"][0], weight, groups)
    if not candidates:
        return {}
    shapes = weight_shapes(symbol, data_shape)
    convs = {}
    for index, (data, weight, groups) in candidates.items():
        filters = int(nodes[index]["attrs"]["num_filter"])
        if shapes.get(nodes[weight[0]]["name"]) == (filters, filters // groups, 3, 3):   # C_in == num_filter
            convs[index] = (data, weight, groups)
    return convs


def layer_norms(graph):
    """{index of a LayerNorm node: its eps} for each LayerNorm sample_fc_layer_norm computes: over
    the last axis (axis -1), three inputs, and nothing (no node, no head) reading its mean or std
    outputs."""
    nodes = graph["nodes"]
    extra_outputs_read = {entry[0] for node in nodes for entry in node["inputs"] if entry[1] != 0}
    extra_outputs_read |= {entry[0] for entry in graph["heads"] if entry[1] != 0}
    norms = {}
    for index, node in enumerate(nodes):
        attrs = node.get("attrs", {})
        if (node["op"] == "LayerNorm" and attrs.get("axis", "-1") == "-1" and len(node["inputs"]) == 3
                and attrs.get("output_mean_var", "False").lower() not in ("true", "1")
                and index not in extra_outputs_read):
            norms[index] = attrs.get("eps", "1e-05")
    return norms


# the operators between an attention's first and last node (symbols/vit.py attention)
ATTENTION_OPS = ("Reshape", "transpose", "SliceChannel", "squeeze", "batch_dot", "_mul_scalar", "broadcast_add",
                 "softmax")


def attentions(graph):
    """{index of an attention's last node: (qkv entry, key_bias entry or None, heads, indices of
    its other nodes)} for each multi-head self-attention symbols/vit.py builds, found by its first
    and last node's names (ATTENTION_ENDS) and checked between them: only ATTENTION_OPS, the
    scores scaled by 1 / sqrt(d), a softmax over the last axis, and nothing outside reading a
    node inside."""
    nodes = graph["nodes"]
    by_name = {node["name"]: index for index, node in enumerate(nodes)}
    readers = {}
    for index, node in enumerate(nodes):
        for entry in node["inputs"]:
            readers.setdefault(entry[0], set()).add(index)
    outputs = {entry[0] for entry in graph["heads"]}
    found = {}
    for last, node in enumerate(nodes):
        if node["op"] != "Reshape" or not node["name"].endswith(ATTENTION_ENDS[1]):
            continue
        first = by_name.get(node["name"][:-len(ATTENTION_ENDS[1])] + ATTENTION_ENDS[0])
        if first is None or nodes[first]["op"] != "Reshape":
            continue
        shape = attr_ints(nodes[first].get("attrs", {}).get("shape"))
        if shape is None or len(shape) != 5 or shape[2] != 3:
            continue
        group, key_bias, todo = set(), None, [last]
        while todo:
            index = todo.pop()
            if index in group:
                continue
            group.add(index)
            if index == first or nodes[index]["op"] not in ATTENTION_OPS:
                continue
            for position, entry in enumerate(nodes[index]["inputs"]):
                if nodes[index]["op"] == "broadcast_add" and position == 1:
                    key_bias = entry
                else:
                    todo.append(entry[0])
        if _attention_between(nodes, group, first, shape[4]) and all(
                readers.get(inner, set()) <= group and inner not in outputs for inner in group - {last}):
            found[last] = (nodes[first]["inputs"][0], key_bias, shape[3], group - {last})
    return found


def _attention_between(nodes, group, first, head):
    """Whether the nodes `group` are an attention's: each one of ATTENTION_OPS, the first one
    among them, two batch_dots, the scores scaled by head ** -0.5, a softmax over the last axis."""
    ops = [nodes[index]["op"] for index in group]
    scales = [float(nodes[index]["attrs"]["scalar"]) for index in group if nodes[index]["op"] == "_mul_scalar"]
    softmaxes = [nodes[index].get("attrs", {}) for index in group if nodes[index]["op"] == "softmax"]
    return (first in group and all(op in ATTENTION_OPS for op in ops) and ops.count("batch_dot") == 2
            and len(scales) == 1 and abs(scales[0] * head ** 0.5 - 1) < 1e-6
            and len(softmaxes) == 1 and softmaxes[0].get("axis", "-1") == "-1")


def weight_shapes(symbol, data_shape=None):
    """{argument name: shape} of the arguments whose shape MXNet infers from `data_shape`
    (the input `data`'s; None: nothing known beyond the symbol's own shape attributes)."""
    known = {"data": tuple(data_shape)} if data_shape is not None and "data" in symbol.list_arguments() else {}
    try:
        arg_shapes, _, _ = symbol.infer_shape_partial(**known)
    except mx.MXNetError:
        return {}
    if arg_shapes is None:
        return {}
    return {name: tuple(shape) for name, shape in zip(symbol.list_arguments(), arg_shapes)
            if shape and 0 not in shape}


def rewrite(graph, replaced):
    """The graph (MXNet's JSON form) with each node of `replaced` ({index: (new node without its
    name, indices of the nodes it stands for besides itself)}) replaced by its new node, under its
    old name, and those other nodes dropped; every node index renumbered."""
    dropped = {inner for _, inners in replaced.values() for inner in inners}
    new_index, nodes = {}, []
    for index, node in enumerate(graph["nodes"]):
        if index in dropped:
            continue
        if index in replaced:
            node = dict(replaced[index][0], name=node["name"])
        new_index[index] = len(nodes)
        nodes.append(node)

    def entry(old):
        if old[0] not in new_index:
            raise ValueError(f"node {graph['nodes'][old[0]]['name']} of a fused group is used outside it")
        return [new_index[old[0]]] + list(old[1:])
    for node in nodes:
        node["inputs"] = [entry(old) for old in node["inputs"]]
    return {"nodes": nodes,
            "arg_nodes": [new_index[i] for i in graph["arg_nodes"]],
            "heads": [entry(old) for old in graph["heads"]],
            "attrs": graph.get("attrs", {})}
