"""An ONNX face-recognition model (insightface's model packs, e.g. w600k_r50.onnx, or our own
tools.export file): run by onnxruntime for the tools (--model X.onnx), or its weights read as
one of our networks' for fine-tuning (--pretrained X.onnx, saved_model maps them).

The graph must have exactly one image input (N, 3, S, S): N fixed or symbolic, S fixed (or
symbolic with --image-size); RGB, as insightface's ArcFaceONNX feeds it. The tools hand it raw
pixels 0..255 and its normalisation is decided as insightface decides it: a graph whose input
first meets an arithmetic op or a BatchNormalization (our exports: Sub 127.5, Mul 1/128; the
zoo's MXNet conversions: _minus, _mul) normalises itself and gets raw pixels; one whose input
goes straight into a layer (arcface_torch's exports such as w600k_r50) gets (x - 127.5) / 127.5,
arcface_torch's training normalisation and ArcFaceONNX's input_mean / input_std. insightface
looks for nodes *named* Sub/_minus and Mul/_mul among the first 8; we look at the op types
that consume the input (names are free-form, often empty). --normalize graph|tool overrides.

onnx and onnxruntime are imported only when an ONNX file is used: training never needs them.
"""
import os

import numpy as np

from ..data.weight_values import implausible_values
from ..errors import MissingFileError, UsageError
from ..pfc.head import omp_threads

SUFFIX = ".onnx"
INSTALL = "python -m pip install onnx==1.16.2 onnxruntime==1.18.1"   # the pins of requirements.txt
INPUT_MEAN, INPUT_STD = 127.5, 127.5          # ArcFaceONNX's, for a graph that does not normalise
PASS_THROUGH = ("Identity", "Cast")           # ops looked through when finding the input's consumer
INPUT_SCALING_OPS = ("Sub", "Add", "Mul", "Div", "BatchNormalization")
# The role of an initializer by the op that consumes it and its position (as saved_model.INPUT_ROLES)
INPUT_ROLES = {"Conv": (None, "conv weight", "conv bias"),
               "Gemm": (None, "fc weight", "fc bias"),
               "MatMul": (None, "fc weight"),
               "BatchNormalization": (None, "bn gamma", "bn beta", "bn mean", "bn var"),
               "PRelu": (None, "prelu slope")}


def is_onnx_file(path):
    return path.lower().endswith(SUFFIX)


def _packages(option, path):
    """(onnx, onnxruntime), or UsageError naming the install line."""
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise UsageError(f"{option} {path}: an ONNX model needs onnx and onnxruntime ({err}); "
                         f"install them: {INSTALL}") from None
    return onnx, onnxruntime


def read_graph(path, option):
    """The onnx ModelProto at `path`; MissingFileError / UsageError (one line) when it is not there
    or cannot be parsed and checked."""
    onnx, _ = _packages(option, path)
    from google.protobuf.message import DecodeError
    if not os.path.isfile(path):
        raise MissingFileError(f"{option} {path}: no such file")
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except (DecodeError, ValueError, RuntimeError, onnx.checker.ValidationError) as err:
        reason = " ".join(str(err).split())[:300] or type(err).__name__
        raise UsageError(f"{option} {path}: not a readable ONNX model, damaged or not ONNX ({reason})") from None
    return model


def _initializer_names(model):
    return {tensor.name for tensor in model.graph.initializer}


def image_input(model, path, option, image_size=None):
    """(input name, fixed batch or None, side S) of the graph's one image input (N, 3, S, S);
    UsageError when it has not exactly one such input."""
    inputs = [value for value in model.graph.input if value.name not in _initializer_names(model)]
    dims = [[d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
            for value in inputs]
    shown = ", ".join(f"{value.name} {tuple('?' if d is None else d for d in shape)}"
                      for value, shape in zip(inputs, dims)) or "none"
    if len(inputs) != 1 or len(dims[0]) != 4 or dims[0][1] != 3 or dims[0][2] != dims[0][3]:
        raise UsageError(f"{option} {path}: the graph must have exactly one image input of shape "
                         f"(N, 3, S, S); its inputs: {shown}")
    side = dims[0][2]
    if side is None and image_size is None:
        raise UsageError(f"{option} {path}: its input {shown} has a symbolic side; pass --image-size")
    if side is not None and image_size is not None and image_size != side:
        raise UsageError(f"--image-size {image_size}: {path} takes {side}x{side} inputs ({shown}); "
                         f"omit --image-size")
    return inputs[0].name, dims[0][0], side or image_size


def _input_consumers(model):
    """The nodes that read the image input, looking through PASS_THROUGH ops."""
    initializers = _initializer_names(model)
    names = {value.name for value in model.graph.input if value.name not in initializers}
    found, frontier = [], names
    while frontier:
        nodes = [node for node in model.graph.node if frontier & set(node.input)]
        found += [node for node in nodes if node.op_type not in PASS_THROUGH]
        frontier = {out for node in nodes if node.op_type in PASS_THROUGH for out in node.output}
    return found


def normalizes_input(model):
    """Whether the graph scales its image input itself (module docstring)."""
    return any(node.op_type in INPUT_SCALING_OPS for node in _input_consumers(model))


def input_normalization(model):
    """(mean, scale) such that the graph computes on (x - mean) * scale of its input x: a chain
    Sub(x, c) [-> Mul(s) or Div(d)] of scalars at its input, or (127.5, 1/127.5) when nothing
    scales it (ArcFaceONNX's rule); None for any other start (per-channel constants, a
    BatchNormalization, more arithmetic after the chain)."""
    from onnx import numpy_helper
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    constants.update({node.output[0]: numpy_helper.to_array(node.attribute[0].t)
                      for node in model.graph.node if node.op_type == "Constant" and node.attribute})

    def scalar(node, positions):
        values = [constants[node.input[i]] for i in positions if node.input[i] in constants]
        return float(values[0].reshape(())) if len(values) == 1 and values[0].size == 1 else None

    def consumers_of(node):
        return [n for n in model.graph.node if node.output[0] in n.input]

    consumers = _input_consumers(model)
    if not any(node.op_type in INPUT_SCALING_OPS for node in consumers):
        return INPUT_MEAN, 1 / INPUT_STD
    mean, scale, nodes = 0.0, 1.0, consumers
    if len(nodes) == 1 and nodes[0].op_type == "Sub":
        mean, nodes = scalar(nodes[0], (1,)), consumers_of(nodes[0])
    if len(nodes) == 1 and nodes[0].op_type in ("Mul", "Div"):
        value = scalar(nodes[0], (0, 1) if nodes[0].op_type == "Mul" else (1,))
        scale = value if nodes[0].op_type == "Mul" or not value else 1 / value
        nodes = consumers_of(nodes[0])
    if mean is None or not scale or (mean, scale) == (0.0, 1.0) or \
            any(node.op_type in INPUT_SCALING_OPS for node in nodes):
        return None
    return mean, scale


class OnnxGraph:
    """A graph run by onnxruntime (CPUExecutionProvider): forward(pixels (N, 3, S, S) raw 0..255)
    -> (N, D) float32. verification.Embedder batches, pads and flip-sums around it."""

    def __init__(self, path, input_name, batch, output, tool_normalizes):
        _, onnxruntime = _packages("--model", path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = omp_threads() or 0        # 0: onnxruntime's default
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors
        try:
            self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        except (ort_errors.Fail, ort_errors.InvalidArgument, ort_errors.InvalidGraph, ort_errors.InvalidProtobuf,
                ort_errors.NotImplemented, ort_errors.RuntimeException, ort_errors.NoSuchFile) as err:
            raise UsageError(f"--model {path}: onnxruntime cannot load it "
                             f"({' '.join(str(err).split())[:300]})") from None
        outputs = [value.name for value in self.session.get_outputs()]
        if output is None and len(outputs) != 1:
            raise UsageError(f"--model {path}: the graph has outputs {', '.join(outputs)}; name the embedding "
                             f"with --output NAME")
        if output is not None and output not in outputs:
            raise UsageError(f"--output {output}: {path} has no such output (its outputs: {', '.join(outputs)})")
        self.output = output or outputs[0]
        self.input_name, self.batch, self.tool_normalizes = input_name, batch, tool_normalizes

    def forward(self, pixels):
        pixels = np.asarray(pixels, dtype=np.float32)
        if self.tool_normalizes:
            pixels = (pixels - INPUT_MEAN) / INPUT_STD
        count, step = len(pixels), self.batch or len(pixels)    # a fixed batch runs piece by piece,
        if count % step:                                            # the last one padded with zeros
            pixels = np.concatenate([pixels, np.zeros((step - count % step,) + pixels.shape[1:], np.float32)])
        rows = [self.session.run([self.output], {self.input_name: pixels[start:start + step]})[0]
                for start in range(0, len(pixels), step)]
        return np.concatenate(rows).reshape(len(pixels), -1)[:count]


def load(path, image_size=None, output=None, normalize="auto"):
    """(OnnxGraph, image side, output name, a note saying who normalises the pixels) for the
    tools' --model X.onnx (normalize: auto, graph or tool; module docstring)."""
    model = read_graph(path, "--model")
    check_finite_weights(model, path, "--model")
    input_name, batch, side = image_input(model, path, "--model", image_size)
    tool = normalize == "tool" or (normalize == "auto" and not normalizes_input(model))
    graph = OnnxGraph(path, input_name, batch, output, tool)
    if tool:
        note = (f"(x - {INPUT_MEAN}) / {INPUT_STD} applied before the graph" +
                (" (--normalize tool)" if normalize == "tool" else
                 ", which does not normalise its input (--normalize graph if it expects 0..255)"))
    else:
        note = "the graph normalises raw pixels" + (" (--normalize graph)" if normalize == "graph" else "")
    return graph, side, graph.output, note


def check_finite_weights(model, path, option):
    """UsageError naming the first weight (an initializer a layer of INPUT_ROLES takes: conv, FC,
    BatchNorm, PReLU) holding a NaN, an infinity or an implausible magnitude
    (data.weight_values): a damaged file (onnx.checker does not look at values, and
    onnxruntime would give NaN embeddings). Other constants may be infinite (a Clip's bound in
    our exports' PReLU)."""
    from onnx import numpy_helper
    layer_inputs = {name for node in model.graph.node if node.op_type in INPUT_ROLES for name in node.input[1:]}
    for tensor in model.graph.initializer:
        if tensor.name not in layer_inputs:
            continue
        values = numpy_helper.to_array(tensor)
        problem = implausible_values(values) if values.dtype.kind == "f" else None
        if problem:
            raise UsageError(f"{option} {path}: its weight {tensor.name} holds {problem}: the file is damaged")


def weights(model):
    """([(name, role, attrs)] of the graph's weights in graph order, as saved_model.parameter_roles
    gives them for a symbol, {name: float32 array}), each FC weight as (out, in) and each
    BatchNormalization given MXNet's attrs (its epsilon, gamma learned)."""
    from onnx import helper, numpy_helper
    arrays = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in model.graph.initializer}
    roles, seen = [], set()
    clipped = {out for node in model.graph.node if node.op_type == "Clip" for out in node.output}
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        known = INPUT_ROLES.get(node.op_type, ())
        for position, name in enumerate(node.input):
            if name not in arrays or name in seen or position >= len(known) or known[position] is None:
                continue
            seen.add(name)
            role = known[position]
            if role == "fc weight" and (node.op_type == "MatMul" or not attrs.get("transB", 0)):
                arrays[name] = arrays[name].T.copy()          # ONNX (in, out) -> MXNet (out, in)
            if role == "conv weight" and arrays[name].shape[1:] == (1, 1, 1) and node.input[0] in clipped:
                role = "prelu slope"      # symbols.common.prelu exported: a 1x1 depthwise conv of Clip(x, max=0)
            mx_attrs = {"eps": str(attrs.get("epsilon", 1e-5)), "fix_gamma": "False"} if role.startswith("bn") else {}
            roles.append((name, role, mx_attrs))
    return roles, arrays


def has_conv_biases(model):
    """Whether some Conv has a bias input (BatchNorm folded into it at export)."""
    return any(node.op_type == "Conv" and len(node.input) > 2 and node.input[2] for node in model.graph.node)
