"""Export a trained backbone to ONNX and check the file with onnxruntime.

    python -m sample_fc.tools.export --model models/demo_mbf --onnx mbf.onnx [--batch-size 1]

The ONNX model has input `data` (batch, 3, S, S), raw RGB pixels 0..255 (the symbol
normalises them in the graph, as in training), and output `embeddings` (batch, D), not
normalised. It is written by MXNet's exporter (mxnet.onnx.export_model), with two fixes
made here:
  - BatchNorm(fix_gamma=True) computes with gamma = 1 whatever value is stored (weight decay
    moves the stored one), but the exporter copies the stored gamma: those are set to 1.
  - the weights are stored as raw bytes, not element by element (see _raw_initializers).
Weights are initializers only, not also graph inputs. The check embeds random pixel batches
with MXNet (inference mode) and onnxruntime and fails (exit 1) unless
    max |onnx - mxnet| / max |mxnet| <= --tolerance (1e-4),
i.e. the largest absolute difference relative to the largest embedding component.
"""
import contextlib
import json
import sys
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from ..launch import omp_threads
from .cli import make_parser, run_or_exit
from .model_io import add_model_arguments, load_model

TOLERANCE = 1e-4


@dataclass
class ExportCheck:
    max_abs: float        # max |onnx - mxnet| over all checked embeddings
    reference_max: float  # max |mxnet|
    output_shape: tuple

    @property
    def relative(self):
        return self.max_abs / max(self.reference_max, 1e-12)

    def line(self):
        return (f"max |onnx - mxnet| = {self.max_abs:.3g}, relative to max |mxnet| "
                f"({self.reference_max:.3g}): {self.relative:.3g}")


def unsupported_ops(symbol):
    """{MXNet op: [node names]} of the symbol's ops that mxnet.onnx cannot convert."""
    supported = set(mx.onnx.get_operator_support())
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
        if node["op"] == "BatchNorm" and node.get("attrs", {}).get("fix_gamma", "True") in ("True", "true", "1"):
            gamma = nodes[node["inputs"][1][0]]["name"]
            params[gamma] = mx.nd.ones_like(arg_params[gamma])
    return params


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


def export_onnx(symbol, arg_params, aux_params, image_size, batch_size, path):
    """Write `path` (ONNX, static input shape (batch_size, 3, S, S)); returns it.
    ValueError naming the ops and nodes if the symbol has ops mxnet.onnx cannot convert."""
    import onnx
    from mxnet.onnx import export_model

    missing = unsupported_ops(symbol)
    if missing:
        raise ValueError("mxnet.onnx cannot convert these ops: " + "; ".join(
            f"{op} (nodes {', '.join(names[:5])})" for op, names in sorted(missing.items())))
    params = fixed_gamma_params(symbol, arg_params)
    params.update(aux_params)
    try:
        with _raw_initializers():
            export_model(symbol, params, in_shapes=[(batch_size, 3, image_size, image_size)],
                         in_types=[np.float32], onnx_file_path=path)
    except NotImplementedError as err:      # a supported op with unsupported attributes
        raise ValueError(f"mxnet.onnx cannot convert this symbol: {err}") from err
    model = onnx.load(path)
    initializers = {tensor.name for tensor in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(inputs)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def compare_with_mxnet(path, symbol, arg_params, aux_params, image_size, batch_size, ctx,
                       batches=2, seed=0):
    """ExportCheck of the ONNX file against MXNet (inference mode, these params) on
    `batches` batches of uniform random pixels 0..255."""
    import onnxruntime

    rng = np.random.default_rng(seed)
    shape = (batch_size, 3, image_size, image_size)
    module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=ctx)
    module.bind(data_shapes=[("data", shape)], for_training=False)
    module.set_params(arg_params, aux_params, allow_missing=False)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = omp_threads() or 0     # 0: onnxruntime's default
    session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    max_abs = reference_max = 0.0
    for _ in range(batches):
        pixels = rng.uniform(0, 255, shape).astype(np.float32)
        module.forward(mx.io.DataBatch([mx.nd.array(pixels, ctx=ctx)]), is_train=False)
        reference = module.get_outputs()[0].asnumpy()
        exported = session.run(None, {"data": pixels})[0]
        if exported.shape != reference.shape:
            raise ValueError(f"{path}: output shape {exported.shape}, MXNet gives {reference.shape}")
        max_abs = max(max_abs, float(np.abs(exported - reference).max()))
        reference_max = max(reference_max, float(np.abs(reference).max()))
    return ExportCheck(max_abs, reference_max, tuple(exported.shape))


def main(argv=None):
    parser = make_parser("sample_fc.tools.export", __doc__)
    add_model_arguments(parser, batch_size=False)
    parser.add_argument("--onnx", required=True, metavar="OUT.onnx", help="file to write")
    parser.add_argument("--batch-size", type=int, default=1, help="the ONNX input's (static) batch size")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="largest allowed max|onnx - mxnet| / max|mxnet| (default %(default)g)")
    parser.add_argument("--check-batches", type=int, default=2, help="random batches compared")
    args = parser.parse_args(argv)
    if args.batch_size <= 0 or args.check_batches <= 0:
        parser.error(f"--batch-size and --check-batches must be positive, got "
                     f"{args.batch_size} and {args.check_batches}")
    def work():
        model = load_model(args.model, args.image_size)
        export_onnx(model.symbol, model.arg_params, model.aux_params, model.image_size,
                    args.batch_size, args.onnx)
        return model, compare_with_mxnet(args.onnx, model.symbol, model.arg_params, model.aux_params,
                                         model.image_size, args.batch_size, args.context,
                                         args.check_batches)

    model, check = run_or_exit(parser, work)
    print(f"wrote {args.onnx}: input data ({args.batch_size}, 3, {model.image_size}, "
          f"{model.image_size}), output embeddings {check.output_shape}")
    print("onnxruntime check: " + check.line())
    if not check.relative <= args.tolerance:
        parser.exit(1, f"{parser.prog}: error: the ONNX model does not match MXNet: relative "
                       f"difference {check.relative:.3g} > tolerance {args.tolerance:g} "
                       f"({args.onnx} is kept for inspection)\n")
    print(f"ok: relative difference {check.relative:.3g} <= tolerance {args.tolerance:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
