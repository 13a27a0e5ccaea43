"""Tests for sample_fc.tools.export: ONNX export of the backbones, checked with onnxruntime."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import onnx
import onnxruntime
import pytest

from sample_fc.tools import export
from sample_fc.tools.export import TOLERANCE, compare_with_mxnet, export_onnx
from bench.harness import single_thread_env
from test_tools import REPO, random_backbone

STORED_GAMMA = 0.5   # a fix_gamma BatchNorm's stored gamma, ignored by MXNet
SMALL = 32           # input side of the small backbones that check the batch axis (fast)


def dims(value):
    """An ONNX value's shape: ints for fixed dimensions, the name for symbolic ones."""
    return [d.dim_param if d.HasField("dim_param") else d.dim_value
            for d in value.type.tensor_type.shape.dim]


def mxnet_embeddings(symbol, arg_params, aux_params, pixels):
    """The reference: MXNet's inference-mode embeddings of one batch of pixels."""
    module = mx.mod.Module(symbol, data_names=("data",), label_names=None, context=mx.cpu())
    module.bind(data_shapes=[("data", pixels.shape)], for_training=False)
    module.set_params(arg_params, aux_params, allow_missing=False)
    module.forward(mx.io.DataBatch([mx.nd.array(pixels)]), is_train=False)
    return module.get_outputs()[0].asnumpy()


def with_moved_gamma(arg_params):
    """The params as weight decay leaves them: the final (fix_gamma) BN's stored gamma != 1."""
    moved = dict(arg_params)
    moved["embeddings_gamma"] = mx.nd.full(arg_params["embeddings_gamma"].shape, STORED_GAMMA)
    return moved


@pytest.fixture(scope="module")
def mbf_checkpoint(tmp_path_factory):
    """A random mbf (D=512, 112x112) saved at prefix <tmp>/model, epoch 1."""
    prefix = str(tmp_path_factory.mktemp("mbf") / "model")
    symbol, arg_params, aux_params = random_backbone("mbf", 512, 112)
    arg_params = with_moved_gamma(arg_params)
    mx.model.save_checkpoint(prefix, 1, symbol, arg_params, aux_params)
    return prefix, symbol, arg_params, aux_params


@pytest.fixture(scope="module")
def small_backbones():
    """{network: (symbol, arg_params, aux_params)}: random mbf, r18 and vit_t, D=64, 32x32."""
    return {network: random_backbone(network, 64, SMALL) for network in ("mbf", "r18", "vit_t")}


def test_mbf_command_exports_a_model_matching_mxnet(mbf_checkpoint, tmp_path):
    """Test that `python -m sample_fc.tools.export` writes an mbf ONNX file with input data
    (batch, 3, 112, 112) and output embeddings (batch, 512), `batch` symbolic, weights as
    initializers only, and that its check runs batch sizes 1 and 4 and passes within 1e-4."""
    prefix, symbol, arg_params, aux_params = mbf_checkpoint
    path = tmp_path / "mbf.onnx"
    result = subprocess.run([sys.executable, "-m", "sample_fc.tools.export", "--model", prefix + ",1",
                             "--onnx", str(path)], cwd=str(REPO), capture_output=True, text=True,
                            timeout=300, env=single_thread_env())
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "ok: relative difference" in result.stdout
    assert "onnxruntime check, batch 1: output (1, 512)" in result.stdout
    assert "onnxruntime check, batch 4: output (4, 512)" in result.stdout
    model = onnx.load(str(path))
    assert [(v.name, dims(v)) for v in model.graph.input] == [("data", ["batch", 3, 112, 112])]
    assert [(v.name, dims(v)) for v in model.graph.output] == [("embeddings", ["batch", 512])]
    for check in compare_with_mxnet(str(path), symbol, arg_params, aux_params, 112, mx.cpu(),
                                    batch_sizes=(1, 2), batches=1):
        print(f"\nmbf 112: {check.line()}")
        assert check.relative <= TOLERANCE and check.reference_max > 0.5


@pytest.mark.parametrize("network", ["mbf", "r18", "vit_t"])
def test_one_file_runs_batches_of_1_3_and_4_matching_mxnet(small_backbones, network, tmp_path):
    """Test that the exported input has a symbolic (non-numeric) batch dimension and that
    onnxruntime, run directly on batches of 1, 3 and 4 from one file, gives MXNet's
    embeddings within 1e-4 relative to max |mxnet| for each (every Reshape and Flatten in
    the graph follows the batch); the file is opset 13, which ONNX's checker accepts with the
    ViT's LayerNorms (at onnx's newest opset it refused them), and every weight is read."""
    symbol, arg_params, aux_params = small_backbones[network]
    path = export_onnx(symbol, arg_params, aux_params, SMALL, str(tmp_path / f"{network}.onnx"))
    model = onnx.load(path)
    (data,), (embeddings,) = model.graph.input, model.graph.output
    assert data.name == "data" and embeddings.name == "embeddings"
    assert isinstance(dims(data)[0], str) and dims(data)[0] != ""
    assert dims(data)[1:] == [3, SMALL, SMALL] and dims(embeddings) == [dims(data)[0], 64]
    assert {node.op_type for node in model.graph.node} >= {"Reshape", "Flatten"}
    assert [(opset.domain, opset.version) for opset in model.opset_import] == [("", export.OPSET)]
    read = {name for node in model.graph.node for name in node.input}
    assert all(tensor.name in read for tensor in model.graph.initializer)
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for batch_size in (1, 3, 4):
        pixels = rng.uniform(0, 255, (batch_size, 3, SMALL, SMALL)).astype(np.float32)
        want = mxnet_embeddings(symbol, arg_params, aux_params, pixels)
        got = session.run(["embeddings"], {"data": pixels})[0]
        assert got.shape == want.shape == (batch_size, 64)
        relative = np.abs(got - want).max() / np.abs(want).max()
        print(f"\n{network} {SMALL}px batch {batch_size}: relative max diff {relative:.3g}")
        assert relative <= TOLERANCE and np.abs(want).max() > 0.5


def test_check_rejects_a_file_with_a_static_batch(small_backbones, tmp_path):
    """Test that the check runs every requested batch size: a file exported the old way,
    with a static batch of 1, passes at batch 1 but fails the check (one-line ValueError)
    at batch 4; and that the command asks for at least two different batch sizes."""
    from mxnet.onnx import export_model

    symbol, arg_params, aux_params = small_backbones["mbf"]
    params = export.fixed_gamma_params(symbol, arg_params)
    params.update(aux_params)
    path = export_model(symbol, params, in_shapes=[(1, 3, SMALL, SMALL)], in_types=[np.float32],
                        onnx_file_path=str(tmp_path / "static.onnx"))
    (check,) = compare_with_mxnet(path, symbol, arg_params, aux_params, SMALL, mx.cpu(),
                                  batch_sizes=(1,), batches=1)
    assert check.relative <= TOLERANCE
    with pytest.raises(ValueError, match="onnxruntime cannot run a batch of 4"):
        compare_with_mxnet(path, symbol, arg_params, aux_params, SMALL, mx.cpu(), batch_sizes=(1, 4))
    with pytest.raises(SystemExit) as stop:
        export.main(["--model", "unused", "--onnx", "unused.onnx", "--check-batch-sizes", "4", "4"])
    assert stop.value.code == 2


def test_r50_export_matches_mxnet_at_112(tmp_path):
    """Test that r50 (D=512, 112x112, ~43M params) exports and matches MXNet within 1e-4,
    with a batch of 2."""
    symbol, arg_params, aux_params = random_backbone("r50", 512, 112)
    arg_params = with_moved_gamma(arg_params)
    path = export_onnx(symbol, arg_params, aux_params, 112, str(tmp_path / "r50.onnx"))
    (check,) = compare_with_mxnet(path, symbol, arg_params, aux_params, 112, mx.cpu(),
                                  batch_sizes=(2,), batches=1)
    print(f"\nr50 112: {check.line()}")
    assert check.output_shape == (2, 512)
    assert check.relative <= TOLERANCE and check.reference_max > 0.5


def test_check_fails_against_other_params(mbf_checkpoint, tmp_path, monkeypatch, capsys):
    """Test that the check catches a wrong export: an ONNX file of other params fails it, and
    the command then exits 1 naming the measured difference."""
    prefix, symbol, arg_params, aux_params = mbf_checkpoint
    _, other_args, other_aux = random_backbone("mbf", 512, 112, seed=1)
    path = export_onnx(symbol, other_args, other_aux, 112, str(tmp_path / "other.onnx"))
    checks = compare_with_mxnet(path, symbol, arg_params, aux_params, 112, mx.cpu(), batches=1)
    assert [check.batch_size for check in checks] == [1, 4]
    assert all(check.relative > 100 * TOLERANCE for check in checks)

    real_export = export.export_onnx
    monkeypatch.setattr(export, "export_onnx", lambda symbol, arg_params, aux_params, *rest:
                        real_export(symbol, other_args, other_aux, *rest))
    with pytest.raises(SystemExit) as stop:
        export.main(["--model", prefix, "--onnx", str(tmp_path / "bad.onnx")])
    assert stop.value.code == 1
    assert "does not match MXNet: relative difference" in capsys.readouterr().err


def test_fix_gamma_batchnorm_exports_with_gamma_one(mbf_checkpoint, tmp_path, monkeypatch):
    """Test that a stored gamma of a fix_gamma BatchNorm, which MXNet ignores, is exported as
    1: without that fix the ONNX embeddings come out scaled by the stored gamma."""
    _, symbol, arg_params, aux_params = mbf_checkpoint
    fixed = export.fixed_gamma_params(symbol, arg_params)
    assert fixed["embeddings_gamma"].asnumpy().tolist() == [1.0] * 512
    assert fixed["stem_bn_gamma"] is arg_params["stem_bn_gamma"]        # fix_gamma=False: kept
    monkeypatch.setattr(export, "fixed_gamma_params", lambda symbol, arg_params: dict(arg_params))
    path = export_onnx(symbol, arg_params, aux_params, 112, str(tmp_path / "unfixed.onnx"))
    (check,) = compare_with_mxnet(path, symbol, arg_params, aux_params, 112, mx.cpu(),
                                  batch_sizes=(1,), batches=1)
    assert check.relative > 0.1


def test_unsupported_op_is_named():
    """Test that a symbol with an op mxnet.onnx cannot convert fails before export, naming the
    op and its node."""
    data = mx.sym.Variable("data")
    symbol = mx.sym.FullyConnected(mx.sym.softsign(mx.sym.Flatten(data), name="squash"),
                                   num_hidden=4, name="fc")
    assert export.unsupported_ops(symbol) == {"softsign": ["squash"]}
    params = {"fc_weight": mx.nd.ones((4, 12)), "fc_bias": mx.nd.zeros((4,))}
    with pytest.raises(ValueError, match=r"softsign \(nodes squash\)"):
        export_onnx(symbol, params, {}, 2, "unused.onnx")


def test_static_batch_on_request(small_backbones, tmp_path):
    """Test that export_onnx(static_batch=3) writes a fixed batch of 3 that matches MXNet at
    that batch, and that onnxruntime refuses another batch size for it."""
    symbol, arg_params, aux_params = small_backbones["mbf"]
    path = export_onnx(symbol, arg_params, aux_params, SMALL, str(tmp_path / "static.onnx"), static_batch=3)
    model = onnx.load(path)
    assert dims(model.graph.input[0]) == [3, 3, SMALL, SMALL]
    (check,) = compare_with_mxnet(path, symbol, arg_params, aux_params, SMALL, mx.cpu(), batch_sizes=(3,),
                                  batches=1)
    assert check.relative <= TOLERANCE and check.output_shape == (3, 64)
    with pytest.raises(ValueError, match="cannot run a batch of 4"):
        compare_with_mxnet(path, symbol, arg_params, aux_params, SMALL, mx.cpu(), batch_sizes=(4,), batches=1)
