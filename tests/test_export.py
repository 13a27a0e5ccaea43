"""Tests for sample_fc.tools.export: ONNX export of the backbones, checked with onnxruntime."""
import subprocess
import sys

import mxnet as mx
import onnx
import pytest

from sample_fc.tools import export
from sample_fc.tools.export import TOLERANCE, compare_with_mxnet, export_onnx
from sample_fc.launch import single_thread_env
from test_tools import REPO, random_backbone

STORED_GAMMA = 0.5   # a fix_gamma BatchNorm's stored gamma, ignored by MXNet


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


def test_mbf_command_exports_a_model_matching_mxnet(mbf_checkpoint, tmp_path):
    """Test that `python -m sample_fc.tools.export` writes an mbf ONNX file with input data
    (1, 3, 112, 112) and output embeddings (1, 512), weights as initializers only, and that
    its check against MXNet passes within 1e-4."""
    prefix, symbol, arg_params, aux_params = mbf_checkpoint
    path = tmp_path / "mbf.onnx"
    result = subprocess.run([sys.executable, "-m", "sample_fc.tools.export", "--model", prefix + ",1",
                             "--onnx", str(path)], cwd=str(REPO), capture_output=True, text=True,
                            timeout=300, env=single_thread_env())
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "ok: relative difference" in result.stdout
    model = onnx.load(str(path))
    dims = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]   # noqa: E731
    assert [(v.name, dims(v)) for v in model.graph.input] == [("data", [1, 3, 112, 112])]
    assert [(v.name, dims(v)) for v in model.graph.output] == [("embeddings", [1, 512])]
    check = compare_with_mxnet(str(path), symbol, arg_params, aux_params, 112, 1, mx.cpu(), batches=3)
    print(f"\nmbf 112: {check.line()}")
    assert check.relative <= TOLERANCE and check.reference_max > 0.5


def test_r50_export_matches_mxnet_at_112(tmp_path):
    """Test that r50 (D=512, 112x112, ~43M params) exports and matches MXNet within 1e-4,
    with a batch of 2."""
    symbol, arg_params, aux_params = random_backbone("r50", 512, 112)
    arg_params = with_moved_gamma(arg_params)
    path = export_onnx(symbol, arg_params, aux_params, 112, 2, str(tmp_path / "r50.onnx"))
    check = compare_with_mxnet(path, symbol, arg_params, aux_params, 112, 2, mx.cpu(), batches=1)
    print(f"\nr50 112: {check.line()}")
    assert check.output_shape == (2, 512)
    assert check.relative <= TOLERANCE and check.reference_max > 0.5


def test_check_fails_against_other_params(mbf_checkpoint, tmp_path, monkeypatch, capsys):
    """Test that the check catches a wrong export: an ONNX file of other params fails it, and
    the command then exits 1 naming the measured difference."""
    prefix, symbol, arg_params, aux_params = mbf_checkpoint
    _, other_args, other_aux = random_backbone("mbf", 512, 112, seed=1)
    path = export_onnx(symbol, other_args, other_aux, 112, 1, str(tmp_path / "other.onnx"))
    check = compare_with_mxnet(path, symbol, arg_params, aux_params, 112, 1, mx.cpu())
    assert check.relative > 100 * TOLERANCE

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
    path = export_onnx(symbol, arg_params, aux_params, 112, 1, str(tmp_path / "unfixed.onnx"))
    check = compare_with_mxnet(path, symbol, arg_params, aux_params, 112, 1, mx.cpu())
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
        export_onnx(symbol, params, {}, 2, 1, "unused.onnx")
