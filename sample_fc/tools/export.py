"""Export a trained backbone to ONNX and check the file with onnxruntime.

    python -m sample_fc.tools.export --model models/demo_mbf_small --onnx mbf.onnx [--check-batch-sizes 1 4]

The ONNX model has input `data` (batch, 3, S, S), raw RGB pixels 0..255 (the symbol
normalises them in the graph, as in training), and output `embeddings` (batch, D), not
normalised; `batch` is a symbolic dimension (dim_param), so one file runs any batch size;
ONNX opset 13 (OPSET).
It is written by MXNet's exporter (mxnet.onnx.export_model, dynamic=True), with fixes made here:
  - BatchNorm(fix_gamma=True) computes with gamma = 1 whatever value is stored (weight decay
    moves the stored one), but the exporter copies the stored gamma: those are set to 1.
  - the weights are stored as raw bytes, not element by element (see _raw_initializers).
  - the exporter leaves every dynamic dimension unnamed (the output's D too): the batch axis
    of input and output is named `batch`, the other dimensions are set to their values.
Weights are initializers only, not also graph inputs. The check embeds random pixel batches
of each --check-batch-sizes size (at least two different ones, default 1 and 4) with MXNet
(inference mode) and onnxruntime, and fails (exit 1) unless for every batch size
    max |onnx - mxnet| / max |mxnet| <= --tolerance (1e-4),
i.e. the largest absolute difference relative to the largest embedding component.
"""
import contextlib
import json
import sys
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from ..symbols.common import fixes_gamma
from ..errors import UsageError
from ..pfc.head import omp_threads
from .cli import Progress, check_output_folder, make_parser, run_or_exit
from .model_io import add_model_arguments, load_model_from_args

TOLERANCE = 1e-4
BATCH_AXIS = "batch"          # the ONNX name of the symbolic batch dimension
CHECK_BATCH_SIZES = (1, 4)    # batch sizes the check runs by default


@dataclass
class ExportCheck:
    """The check at one batch size."""
    batch_size: int
    max_abs: float        # max |onnx - mxnet| over the checked embeddings of this batch size
    reference_max: float  # max |mxnet|
    output_shape: tuple   # of the ONNX output at this batch size

    @property
    def relative(self):
        return self.max_abs / max(self.reference_max, 1e-12)

    def line(self):
        return (f"batch {self.batch_size}: output {self.output_shape}, "
                f"max |onnx - mxnet| = {self.max_abs:.3g}, relative to max |mxnet| "
                f"({self.reference_max:.3g}): {self.relative:.3g}")


# The ONNX opset of every file written here: mxnet.onnx's converters are written for opsets 12
# and 13 (its LayerNorm is a ReduceMean with an `axes` attribute, which opset 18 on no longer
# has), but it declares the installed onnx's newest (21 for onnx 1.16), so the ViTs' files
# were refused by ONNX's checker. onnxruntime runs opset 13 everywhere.
OPSET = 13


def unsupported_ops(symbol):
    """{MXNet op: [node names]} of the symbol's ops that mxnet.onnx cannot convert at OPSET."""
    supported = set(mx.onnx.get_operator_support(OPSET))
    missing = {}
    for node in json.loads(symbol.tojson())["nodes"]:
        if node["op"] not in supported:
            missing.setdefault(node["op"], []).append(node["name"])
    return missing


def fixed_gamma_params(symbol, arg_params):
    """A copy of arg_params with gamma = 1 for every BatchNorm with fix_gamma=True (MXNet's
    default when the attribute is absent), as MXNet itself computes them."""
    nodes = json.loads(symbol.tojson())["nodes"]
    params = dict(arg_params)
    for node in nodes:
        if node["op"] == "BatchNorm" and fixes_gamma(node.get("attrs", {})):
            gamma = nodes[node["inputs"][1][0]]["name"]
            params[gamma] = mx.nd.ones_like(arg_params[gamma])
    return params


@contextlib.contextmanager
def _opset(version):
    """Make mxnet.onnx write (and check its graph at) ONNX opset `version`: it reads the opset
    from onnx.defs.onnx_opset_version() and checks the graph with onnx.checker's default
    context, both the installed onnx's newest."""
    import onnx.checker
    import onnx.defs

    newest, context = onnx.defs.onnx_opset_version, onnx.checker.DEFAULT_CONTEXT
    saved = dict(context.opset_imports)
    onnx.defs.onnx_opset_version = lambda: version
    context.opset_imports = {"": version}
    try:
        yield
    finally:
        onnx.defs.onnx_opset_version = newest
        context.opset_imports = saved


@contextlib.contextmanager
def _raw_initializers():
    """Make mxnet.onnx store float weights as raw bytes while exporting.

    mx2onnx builds every weight with onnx.helper.make_tensor(vals=list of floats), i.e. one
    protobuf `float_data` element per value. With the pure-Python protobuf that
    requirements.txt pins (3.20.3 has no C++ extension for Python 3.11) building and writing
    r50's 43M floats that way takes minutes; the same values as `raw_data` bytes (what
    onnx.numpy_helper.from_array makes, read identically by every ONNX consumer) take seconds.
    """
    import onnx
    from onnx import numpy_helper

    original = onnx.helper.make_tensor

    def make_tensor(name, data_type, dims, vals, raw=False):
        if not raw and data_type == onnx.TensorProto.FLOAT:
            return numpy_helper.from_array(np.asarray(vals, dtype=np.float32).reshape(dims), name)
        return original(name, data_type, dims, vals, raw)

    onnx.helper.make_tensor = make_tensor
    try:
        yield
    finally:
        onnx.helper.make_tensor = original


def _name_batch_axis(model, symbol, image_size):
    """Give the graph's input `data` the shape (batch, 3, S, S) and each output (batch, ...),
    `batch` symbolic and the other dimensions their values (MXNet's inferred shapes)."""
    _, output_shapes, _ = symbol.infer_shape(data=(1, 3, image_size, image_size))
    shapes = {"data": (1, 3, image_size, image_size)}
    shapes.update(zip((value.name for value in model.graph.output), output_shapes))
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(shapes[value.name]):
            raise ValueError(f"ONNX {value.name} has {len(dims)} dimensions, MXNet's has shape "
                             f"{shapes[value.name]}")
        for axis, (dim, size) in enumerate(zip(dims, shapes[value.name])):
            dim.Clear()
            if axis == 0:
                dim.dim_param = BATCH_AXIS
            else:
                dim.dim_value = size


def export_onnx(symbol, arg_params, aux_params, image_size, path, static_batch=None):
    """Write `path` (ONNX, input `data` (batch, 3, S, S) with a symbolic batch, or the fixed
    `static_batch` when given); returns it. UsageError naming the ops and nodes if the symbol
    has ops mxnet.onnx cannot convert."""
    import onnx
    from mxnet.onnx import export_model

    missing = unsupported_ops(symbol)
    if missing:
        raise UsageError("mxnet.onnx cannot convert these ops: " + "; ".join(
            f"{op} (nodes {', '.join(names[:5])})" for op, names in sorted(missing.items())))
    symbol = _explicit_fc_flatten(symbol, image_size)
    params = fixed_gamma_params(symbol, arg_params)
    params.update(aux_params)
    try:
        with _raw_initializers(), _opset(OPSET):
            # in_shapes only seeds MXNet's shape inference; dynamic=True makes every Reshape
            # read the batch from the tensor at run time (checked at several batch sizes)
            dynamic = {} if static_batch else {
                "dynamic": True, "dynamic_input_shapes": [(None, 3, image_size, image_size)]}
            export_model(symbol, params, in_shapes=[(static_batch or 1, 3, image_size, image_size)],
                         in_types=[np.float32], onnx_file_path=path, **dynamic)
    except NotImplementedError as err:      # a supported op with unsupported attributes
        raise UsageError(f"mxnet.onnx cannot convert this symbol: {err}") from err
    model = onnx.load(path)
    _channel_slopes(model)
    _drop_unused_initializers(model)
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    if not static_batch:
        _name_batch_axis(model, symbol, image_size)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def _explicit_fc_flatten(symbol, image_size):
    """The symbol with flatten="True" written on every FullyConnected of a more than 2-d input
    that relies on the default: mxnet.onnx reads a missing flatten as False, and such a layer
    (insightface's pre_fc1 right after its last BatchNorm) becomes a Gemm on unflattened data.
    sample_fc's symbols flatten first and are returned unchanged."""
    internals = symbol.get_internals()
    _, shapes, _ = internals.infer_shape(data=(1, 3, image_size, image_size))
    ndim = {name: len(shape) for name, shape in zip(internals.list_outputs(), shapes)}
    graph = json.loads(symbol.tojson())
    nodes, changed = graph["nodes"], False
    for node in nodes:
        if node["op"] != "FullyConnected" or "flatten" in node.get("attrs", {}):
            continue
        source, output = node["inputs"][0][:2]
        name = nodes[source]["name"]
        candidates = [name] if nodes[source]["op"] == "null" else [f"{name}_output", f"{name}_output{output}"]
        if max(ndim.get(candidate, 2) for candidate in candidates) > 2:
            node.setdefault("attrs", {})["flatten"] = "True"
            changed = True
    return mx.sym.load_json(json.dumps(graph)) if changed else symbol


def _drop_unused_initializers(model):
    """Remove the initializers no node reads (mxnet.onnx leaves a constant behind for the ViTs'
    softmax; onnxruntime warns of it at every load)."""
    used = {name for node in model.graph.node for name in node.input}
    unused = [tensor for tensor in model.graph.initializer if tensor.name not in used]
    for tensor in unused:
        model.graph.initializer.remove(tensor)


def _channel_slopes(model):
    """Give every PRelu's 1-d slope the shape (C, 1, 1). mxnet.onnx writes the (C,) gamma of
    LeakyReLU(act_type='prelu') (insightface's MXNet models use it) as it is, which ONNX
    broadcasts along the last axis (the width) instead of the channels. sample_fc's own
    symbols build PReLU from other ops (symbols.common.prelu) and have no PRelu node."""
    from onnx import numpy_helper
    slopes = {node.input[1] for node in model.graph.node if node.op_type == "PRelu"}
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in slopes and len(tensor.dims) == 1:
            value = numpy_helper.to_array(tensor)
            model.graph.initializer[index].CopyFrom(
                numpy_helper.from_array(value.reshape(-1, 1, 1), tensor.name))


def compare_with_mxnet(path, symbol, arg_params, aux_params, image_size, ctx,
                       batch_sizes=CHECK_BATCH_SIZES, batches=2, seed=0, progress=True):
    """[ExportCheck per batch size] of the ONNX file against MXNet (inference mode, these
    params), each on `batches` batches of uniform random pixels 0..255. UsageError (the check's
    verdict on the file, as a difference above the tolerance is) if onnxruntime cannot run a
    batch size (e.g. a file with a static batch) or gives another output shape than MXNet."""
    import onnxruntime
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

    rng = np.random.default_rng(seed)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = omp_threads() or 0     # 0: onnxruntime's default
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    checks = []
    bar = Progress(len(batch_sizes) * batches, "onnxruntime check", enabled=progress, unit="batches")
    for batch_size in batch_sizes:
        shape = (batch_size, 3, image_size, image_size)
        module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=ctx)
        module.bind(data_shapes=[("data", shape)], for_training=False)
        module.set_params(arg_params, aux_params, allow_missing=False)
        max_abs = reference_max = 0.0
        for _ in range(batches):
            pixels = rng.uniform(0, 255, shape).astype(np.float32)
            module.forward(mx.io.DataBatch([mx.nd.array(pixels, ctx=ctx)]), is_train=False)
            reference = module.get_outputs()[0].asnumpy()
            try:
                exported = session.run(None, {"data": pixels})[0]
            except (ort_errors.InvalidArgument, ort_errors.RuntimeException, ort_errors.Fail) as err:
                raise UsageError(f"{path}: onnxruntime cannot run a batch of {batch_size}: "
                                 f"{' '.join(str(err).split())}") from err
            if exported.shape != reference.shape:
                raise UsageError(f"{path}: output shape {exported.shape} for a batch of "
                                 f"{batch_size}, MXNet gives {reference.shape}")
            max_abs = max(max_abs, float(np.abs(exported - reference).max()))
            reference_max = max(reference_max, float(np.abs(reference).max()))
            bar.update()
        checks.append(ExportCheck(batch_size, max_abs, reference_max, tuple(exported.shape)))
    return checks


def main(argv=None):
    parser = make_parser("sample_fc.tools.export", __doc__)
    add_model_arguments(parser, batch_size=False)
    parser.add_argument("--onnx", required=True, metavar="OUT.onnx", help="file to write")
    parser.add_argument("--check-batch-sizes", type=int, nargs="+", default=list(CHECK_BATCH_SIZES),
                        metavar="N", help="batch sizes the onnxruntime check runs, at least two "
                                          "different ones (default "
                                          f"{' '.join(map(str, CHECK_BATCH_SIZES))}); the "
                                          "file itself accepts any batch size")
    parser.add_argument("--static-batch", type=int, default=None, metavar="N",
                        help="write a fixed batch of N instead of a symbolic one (for runtimes "
                             "that need it); the check then runs at batch N only")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="largest allowed max|onnx - mxnet| / max|mxnet| (default %(default)g)")
    parser.add_argument("--check-batches", type=int, default=2,
                        help="random batches compared per batch size (default %(default)s)")
    args = parser.parse_args(argv)
    if args.static_batch is not None:
        if args.static_batch <= 0:
            parser.error(f"--static-batch must be positive, got {args.static_batch}")
        args.check_batch_sizes = [args.static_batch]
    elif min(args.check_batch_sizes) <= 0 or len(set(args.check_batch_sizes)) < 2:
        parser.error(f"--check-batch-sizes needs at least two different positive sizes, got "
                     f"{' '.join(map(str, args.check_batch_sizes))}")
    if args.check_batches <= 0:
        parser.error(f"--check-batches must be positive, got {args.check_batches}")

    def work():
        check_output_folder(args.onnx, "--onnx")
        model = load_model_from_args(args)
        if not isinstance(model.symbol, mx.sym.Symbol):
            raise UsageError(f"--model {args.model}: already an ONNX model; export takes an MXNet or .pth one")
        print(model.line(), flush=True)
        export_onnx(model.symbol, model.arg_params, model.aux_params, model.image_size, args.onnx,
                    args.static_batch)
        return model, compare_with_mxnet(args.onnx, model.symbol, model.arg_params, model.aux_params,
                                         model.image_size, args.context, args.check_batch_sizes,
                                         args.check_batches)

    model, checks = run_or_exit(parser, work)
    embedding_size = checks[0].output_shape[1]
    batch = args.static_batch or BATCH_AXIS
    print(f"wrote {args.onnx}: input data ({batch}, 3, {model.image_size}, "
          f"{model.image_size}), output embeddings ({batch}, {embedding_size})")
    for check in checks:
        print("onnxruntime check, " + check.line())
    worst = max(checks, key=lambda check: check.relative)
    if not worst.relative <= args.tolerance:
        parser.exit(1, f"{parser.prog}: error: the ONNX model does not match MXNet: relative "
                       f"difference {worst.relative:.3g} at batch {worst.batch_size} > tolerance "
                       f"{args.tolerance:g} ({args.onnx} is kept for inspection)\n")
    print(f"ok: relative difference {worst.relative:.3g} <= tolerance {args.tolerance:g} "
          f"at batch sizes {', '.join(str(check.batch_size) for check in checks)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
