"""Tests for ONNX models in the tools (--model X.onnx, sample_fc.models.onnx_model through
verification.Embedder) and as train.py's --pretrained X.onnx (saved_model._onnx_pretrained)."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sample_fc import symbols
from sample_fc.models import onnx_model
from sample_fc.errors import UsageError
from sample_fc.models.saved_model import load_model, load_pretrained
from sample_fc.tools import embed, export, verify
from sample_fc.tools.export import export_onnx
from sample_fc.verification import Embedder
from test_tools import REPO, SIZE, random_backbone, workspace, write_faces  # noqa: F401 (a fixture)

TOLERANCE = 1e-4     # ONNX vs MXNet, relative to the largest embedding component


def relative_difference(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def exported(workspace, tmp_path_factory):  # noqa: F811
    """The workspace's tiny mbf exported by `tools.export` (its own onnxruntime check passing)."""
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    assert export.main(["--model", str(workspace["models"]), "--onnx", str(path)]) == 0
    return path


def test_embed_with_an_onnx_model_gives_the_mxnet_models_embeddings(workspace, exported, tmp_path):  # noqa: F811
    """Test that embed --model X.onnx (our export, normalising in its graph) writes the rows the
    MXNet checkpoint gives (1e-4), flip-summed as the Embedder does, at the graph's input size."""
    folder = tmp_path / "images"
    write_faces(str(folder), 5, seed=3)
    model = load_model(str(exported))
    assert model.image_size == SIZE and model.output == "embeddings" and model.arg_params == {}
    assert "the graph normalises raw pixels" in model.line()
    rows = {}
    for name, spec, flip in (("onnx", exported, []), ("mxnet", workspace["models"], []),
                             ("onnx-noflip", exported, ["--no-flip"])):
        out = tmp_path / f"{name}.npy"
        assert embed.main(["--model", str(spec), "--images", str(folder), "--out", str(out),
                           "--batch-size", "2", "--no-progress"] + flip) == 0
        rows[name] = np.load(out)
    assert rows["onnx"].shape == (5, 16)
    assert relative_difference(rows["onnx"], rows["mxnet"]) <= TOLERANCE
    assert np.abs(rows["onnx"] - rows["onnx-noflip"]).max() > 1e-3      # the flip is really summed


def test_verify_with_an_onnx_model_scores_as_the_mxnet_model(workspace, exported, capsys):  # noqa: F811
    """Test that verify --model X.onnx prints a result line, and that the embeddings and scores
    behind it are the MXNet model's (embeddings within 1e-4, same accuracy)."""
    assert verify.main(["--model", str(exported), "--bin", str(workspace["bin"]), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "tiny.onnx (ONNX, onnxruntime on the CPU)" in out.split("\n")[0]
    onnx_result = verify.verify(load_model(str(exported)), [str(workspace["bin"])], 4, mx.cpu(), progress=False)
    mxnet_result = verify.verify(load_model(str(workspace["models"])), [str(workspace["bin"])], 4, mx.cpu(),
                                 progress=False)
    assert onnx_result[0][1].accuracy == mxnet_result[0][1].accuracy
    assert abs(onnx_result[0][1].embedding_norm - mxnet_result[0][1].embedding_norm) \
        <= TOLERANCE * mxnet_result[0][1].embedding_norm
    assert onnx_result[0][1].line("pairs") in out
    pixels = np.random.default_rng(0).uniform(0, 255, (3, 3, SIZE, SIZE)).astype(np.float32)
    onnx_rows = Embedder(load_model(str(exported)).symbol, {}, {}, mx.cpu(), SIZE, batch_size=2)(pixels)
    mxnet_rows = Embedder(workspace["symbol"], workspace["arg_params"], workspace["aux_params"], mx.cpu(), SIZE,
                          batch_size=2)(pixels)
    assert relative_difference(onnx_rows, mxnet_rows) <= TOLERANCE


# A tiny recognition graph built with onnx.helper: Conv 3->4 (3x3) -> Flatten -> Gemm -> (N, 5).
SIDE = 8


def tiny_graph(path, inside, batch="N", name="tiny"):
    """Write the tiny graph; `inside`: it starts with Sub 127.5, Div 127.5 (ArcFaceONNX's
    normalisation in the graph), else its input goes straight into the Conv. Returns weights."""
    rng = np.random.default_rng(1)
    conv, fc, bias = (rng.normal(0, 0.3, (4, 3, 3, 3)), rng.normal(0, 0.1, (5, 4 * 6 * 6)), rng.normal(0, 0.1, 5))
    inits = [numpy_helper.from_array(np.float32(value), label)
             for value, label in ((conv, "w"), (fc, "fc"), (bias, "b"), (127.5, "mean"), (127.5, "std"))]
    nodes = [helper.make_node("Sub", ["input.1", "mean"], ["centred"]),
             helper.make_node("Div", ["centred", "std"], ["scaled"])] if inside else []
    nodes += [helper.make_node("Conv", ["scaled" if inside else "input.1", "w"], ["conv"]),
              helper.make_node("Flatten", ["conv"], ["flat"]),
              helper.make_node("Gemm", ["flat", "fc", "b"], ["683"], transB=1)]
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("input.1", TensorProto.FLOAT,
                                                                          [batch, 3, SIDE, SIDE])],
                              [helper.make_tensor_value_info("683", TensorProto.FLOAT, [batch, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return conv, fc, bias


def numpy_tiny(x, conv, fc, bias):
    """The tiny graph's output for inputs x (N, 3, 8, 8), in NumPy (float64)."""
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))   # N, 3, 6, 6, 3, 3
    features = np.einsum("nchwij,ocij->nohw", windows, conv).reshape(len(x), -1)
    return features @ fc.T + bias


def test_normalisation_outside_or_inside_the_graph(tmp_path):
    """Test the rule: a graph whose input goes straight into a Conv gets (x - 127.5) / 127.5 from
    the tool, one that starts with Sub/Div gets raw pixels, so both give NumPy's embeddings of the
    normalised pixels (flip-summed); --normalize graph feeds the first raw pixels; a graph with a
    fixed batch of 1 runs any batch."""
    pixels = np.random.default_rng(2).uniform(0, 255, (3, 3, SIDE, SIDE)).astype(np.float32)
    conv, fc, bias = tiny_graph(tmp_path / "outside.onnx", inside=False)
    tiny_graph(tmp_path / "inside.onnx", inside=True)
    tiny_graph(tmp_path / "batch1.onnx", inside=False, batch=1)
    scaled = (pixels.astype(np.float64) - 127.5) / 127.5
    want = numpy_tiny(scaled, conv, fc, bias) + numpy_tiny(scaled[:, :, :, ::-1], conv, fc, bias)
    for name in ("outside", "inside", "batch1"):
        model = load_model(str(tmp_path / f"{name}.onnx"))
        assert model.image_size == SIDE and model.output == "683"
        assert ("applied before the graph" in model.input_note) == (name != "inside")
        got = Embedder(model.symbol, {}, {}, mx.cpu(), SIDE, batch_size=2)(pixels)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    raw = load_model(str(tmp_path / "outside.onnx"), normalize="graph")
    got = Embedder(raw.symbol, {}, {}, mx.cpu(), SIDE, flip=False)(pixels)
    np.testing.assert_allclose(got, numpy_tiny(pixels.astype(np.float64), conv, fc, bias), rtol=1e-5, atol=1e-2)
    assert onnx_model.input_normalization(onnx.load(str(tmp_path / "inside.onnx"))) == (127.5, 1 / 127.5)


def one_line_exit_2(main, argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    error = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(error) == 1, error
    return error[0]


def test_a_damaged_onnx_file_is_one_line_exit_2(workspace, exported, tmp_path, capsys):  # noqa: F811
    """Test that a truncated ONNX file and one that is not ONNX end embed and verify with one line
    naming the file, exit 2; and that export refuses an ONNX --model in one line."""
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(exported.read_bytes()[:len(exported.read_bytes()) // 2])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07 this is not an onnx model \xff\xfe" * 10)
    write_faces(str(tmp_path / "images"), 2)
    for path in (truncated, garbage):
        line = one_line_exit_2(embed.main, ["--model", str(path), "--images", str(tmp_path / "images"),
                                            "--out", str(tmp_path / "e.npy")], capsys)
        assert str(path) in line and "ONNX" in line, line
        line = one_line_exit_2(verify.main, ["--model", str(path), "--bin", str(workspace["bin"])], capsys)
        assert str(path) in line, line
    line = one_line_exit_2(export.main, ["--model", str(exported), "--onnx", str(tmp_path / "again.onnx")], capsys)
    assert "already an ONNX model" in line


def test_a_graph_without_one_image_input_is_one_line(tmp_path):
    """Test that a graph with two inputs, or with a 1-channel or non-square input, is refused
    naming its inputs, and a symbolic side asks for --image-size."""
    def graph(inputs, path):
        nodes = [helper.make_node("Flatten", [inputs[0][0]], ["out"])]
        values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs]
        model = helper.make_graph(nodes, "g", values, [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "D"])])
        onnx.save(helper.make_model(model, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return str(path)
    cases = {"two": [("a", ["N", 3, 8, 8]), ("b", ["N", 3, 8, 8])], "gray": [("a", ["N", 1, 8, 8])],
             "wide": [("a", ["N", 3, 8, 16])]}
    for name, inputs in cases.items():
        with pytest.raises(UsageError, match=r"exactly one image input of shape \(N, 3, S, S\); its inputs: a ") as err:
            load_model(graph(inputs, tmp_path / f"{name}.onnx"))
        assert "\n" not in str(err.value)
    symbolic = graph([("a", ["N", 3, "S", "S"])], tmp_path / "symbolic.onnx")
    with pytest.raises(UsageError, match="pass --image-size"):
        load_model(symbolic)
    assert load_model(symbolic, image_size=8).image_size == 8


def test_onnxruntime_missing_names_the_install_line(exported, monkeypatch):
    """Test that without onnxruntime an ONNX model is one UsageError naming the pip line, and that
    importing the training side (builder, saved_model, train) does not import onnxruntime (onnx
    itself mxnet 1.9.1 imports when it is installed, for mxnet.onnx)."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(UsageError, match=r"install them: python -m pip install onnx==1\.16\.2 onnxruntime==1\.18\.1"):
        load_model(str(exported))
    result = subprocess.run([sys.executable, "-c", "import sys, sample_fc.builder, sample_fc.models.saved_model, train; "
                             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'onnxruntime'))"],
                            cwd=str(REPO), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr[-2000:]


def renamed(path, out):
    """A copy of the ONNX file with every initializer named w0, w1, ... (as another exporter names them)."""
    model = onnx.load(str(path))
    names = {tensor.name: f"w{i}" for i, tensor in enumerate(model.graph.initializer)}
    for tensor in model.graph.initializer:
        tensor.name = names[tensor.name]
    for node in model.graph.node:
        node.input[:] = [names.get(name, name) for name in node.input]
    onnx.save(model, str(out))
    return str(out)


@pytest.mark.parametrize("network", ["mbf_small", "r18"])
def test_pretrained_from_our_exported_onnx_equals_the_parameters(network, tmp_path):
    """Test that --pretrained X.onnx of our export gives the original parameters bit for bit (by
    name), and the same from a copy whose initializers are renamed (by structure); the fixed-gamma
    BatchNorm's stored gamma (0.5 here, ignored by MXNet) comes back as the 1 MXNet computes with."""
    symbol, arg_params, aux_params = random_backbone(network, 16, SIZE, seed=4)
    arg_params = dict(arg_params, embeddings_gamma=mx.nd.full((16,), 0.5))
    path = export_onnx(symbol, arg_params, aux_params, SIZE, str(tmp_path / f"{network}.onnx"))
    notes = []
    for spec in (path, renamed(path, tmp_path / "renamed.onnx")):
        args, auxs = load_pretrained(spec, symbol, SIZE, network, notes.append)
        assert sorted(args) == sorted(n for n in symbol.list_arguments() if n != "data")
        assert sorted(auxs) == sorted(symbol.list_auxiliary_states())
        for name, value in list(args.items()) + list(auxs.items()):
            want = np.ones(16, np.float32) if name == "embeddings_gamma" else \
                (arg_params[name] if name in arg_params else aux_params[name]).asnumpy()
            np.testing.assert_array_equal(value.asnumpy(), want, err_msg=name)
    assert "by name" in notes[0] and "matched by structure" in notes[1], notes


def test_an_onnx_graph_that_does_not_map_is_one_line(tmp_path):
    """Test that --pretrained from an ONNX graph of another network (by name and renamed), or of
    one whose BatchNorms are folded into conv biases, is one UsageError line saying it does not map
    onto this run's network and where."""
    symbol, arg_params, aux_params = random_backbone("r18", 16, SIZE)
    path = export_onnx(symbol, arg_params, aux_params, SIZE, str(tmp_path / "r18.onnx"))
    target = symbols.get_symbol("mbf_small", embedding_size=16, image_size=SIZE)
    for spec in (path, renamed(path, tmp_path / "renamed.onnx")):
        with pytest.raises(UsageError, match="does not map onto .*'mbf_small' at 32 px") as err:
            load_pretrained(spec, target, SIZE, "mbf_small")
        assert "\n" not in str(err.value)
    model = onnx.load(path)      # fold every Conv -> BatchNormalization pair as torch.onnx does
    folded = tmp_path / "folded.onnx"
    producer = {node.output[0]: node for node in model.graph.node}
    for node in list(model.graph.node):
        conv = producer.get(node.input[0])
        if node.op_type == "BatchNormalization" and conv is not None and conv.op_type == "Conv":
            channels = [t.dims[0] for t in model.graph.initializer if t.name == conv.input[1]][0]
            bias = numpy_helper.from_array(np.zeros(channels, np.float32), conv.input[1] + "_bias")
            model.graph.initializer.append(bias)
            conv.input.append(bias.name)
            conv.output[0] = node.output[0]
            model.graph.node.remove(node)
    onnx.save(model, str(folded))
    renamed(folded, folded)
    with pytest.raises(UsageError, match="carry biases .BatchNorm folded"):
        load_pretrained(str(folded), symbols.get_symbol("r18", embedding_size=16, image_size=SIZE), SIZE, "r18")


def test_a_graph_normalised_outside_runs_and_loads_with_its_scale_folded(tmp_path):
    """Test an arcface_torch-style r18 graph (our export, initializers renamed, its Sub/Mul start
    removed and the stem conv scaled to take (x - 127.5) / 127.5): the tools feed it that and give
    the MXNet model's embeddings (1e-4), and --pretrained folds 128/127.5 back into the stem conv
    (the original parameters within 1e-6)."""
    symbol, arg_params, aux_params = random_backbone("r18", 16, SIZE, seed=5)
    path = renamed(export_onnx(symbol, arg_params, aux_params, SIZE, str(tmp_path / "r18.onnx")),
                   tmp_path / "renamed.onnx")
    model = onnx.load(path)
    sub, mul, conv = model.graph.node[:3]
    assert (sub.op_type, mul.op_type, conv.op_type) == ("Sub", "Mul", "Conv")
    conv.input[0] = sub.input[0]
    model.graph.node.remove(sub)
    model.graph.node.remove(mul)
    stem = next(t for t in model.graph.initializer if t.name == conv.input[1])
    stem.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(stem) * np.float32(127.5 / 128), stem.name))
    outside = tmp_path / "outside.onnx"
    onnx.save(model, str(outside))
    loaded = load_model(str(outside))
    assert "(x - 127.5) / 127.5 applied before the graph" in loaded.input_note
    pixels = np.random.default_rng(6).uniform(0, 255, (3, 3, SIZE, SIZE)).astype(np.float32)
    got = Embedder(loaded.symbol, {}, {}, mx.cpu(), SIZE, batch_size=2)(pixels)
    want = Embedder(symbol, arg_params, aux_params, mx.cpu(), SIZE, batch_size=2)(pixels)
    assert relative_difference(got, want) <= TOLERANCE
    notes = []
    args, auxs = load_pretrained(str(outside), symbol, SIZE, "r18", notes.append)
    assert any("folded into stem_conv_weight" in line for line in notes), notes
    for name, value in list(args.items()) + list(auxs.items()):
        original = np.ones(16, np.float32) if name == "embeddings_gamma" else \
            (arg_params[name] if name in arg_params else aux_params[name]).asnumpy()
        np.testing.assert_allclose(value.asnumpy(), original, rtol=1e-6, atol=1e-7, err_msg=name)


def test_an_onnx_file_with_a_nan_weight_is_one_line_in_the_tools_and_pretrained(workspace, exported, tmp_path,  # noqa: F811
                                                                                 capsys):
    """Test that an ONNX model one of whose weights holds a NaN (a damaged file onnx.checker
    passes) ends embed in one line naming the weight, and is refused as --pretrained, instead of
    NaN embeddings or a training run that stops at its first step."""
    import onnx
    from onnx import numpy_helper
    from sample_fc.errors import UsageError
    from sample_fc.models.saved_model import load_pretrained
    model = onnx.load(str(exported))
    first = next(t for t in model.graph.initializer if numpy_helper.to_array(t).size > 4)
    values = numpy_helper.to_array(first).copy()
    values.flat[3] = np.nan
    first.CopyFrom(numpy_helper.from_array(values, first.name))
    damaged = tmp_path / "nan.onnx"
    onnx.save(model, str(damaged))
    write_faces(str(tmp_path / "images"), 2)
    line = one_line_exit_2(embed.main, ["--model", str(damaged), "--images", str(tmp_path / "images"),
                                        "--out", str(tmp_path / "e.npy")], capsys)
    assert f"{damaged}: its weight {first.name} holds 1 non-finite values" in line, line
    with pytest.raises(UsageError, match=f"--pretrained {damaged}: .* holds 1 non-finite values"):
        load_pretrained(str(damaged), workspace["symbol"], SIZE, "mbf")
