"""Models from elsewhere in the tools and in --pretrained: checkpoints in the original MXNet
toolkit's naming (tests/original_models.py), with and without their own input normalisation,
and with the training head the original saved beside fc1."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
from original_models import forward, save_original
from sample_fc.errors import UsageError
from bench.harness import single_thread_env
from sample_fc.models.saved_model import load_pretrained
from sample_fc.tools import embed, make_bin
from test_tools import REPO, write_faces, write_pairs

SIZE, DIM, UNITS = 32, 16, (2, 2, 2, 2)          # an r18 at 32 px, D 16


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """Three original-naming r18 models (normalising graph, raw graph, training symbol), a
    folder of 5 images and a 20-pair .bin."""
    root = tmp_path_factory.mktemp("originals")
    models = {"graph": save_original(str(root / "graph"), UNITS, DIM, SIZE, seed=0),
              "raw": save_original(str(root / "raw"), UNITS, DIM, SIZE, seed=1, normalizes_input=False),
              "training": save_original(str(root / "training"), UNITS, DIM, SIZE, seed=2, with_training_head=10)}
    write_faces(str(root / "images"), 5, seed=3)
    write_pairs(root, 20)
    assert make_bin.make_bin(str(root / "pairs.txt"), str(root / "pairs.bin"), image_size=SIZE) == 20
    return root, models


def run_tool(module, *args):
    return subprocess.run([sys.executable, "-m", module] + [str(a) for a in args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=300, env=single_thread_env())


def folder_pixels(folder):
    """The images embed reads, in its row order, as float32 NCHW raw pixels."""
    paths = embed.list_images(str(folder))
    return np.stack([embed.read_image(str(folder / p), SIZE) for p in paths]).transpose(0, 3, 1, 2).astype(np.float32)


def fc1_embeddings(symbol, arg_params, aux_params, pixels, layer="fc1"):
    """L2-normalised flip-summed `layer` outputs, computed with a plain MXNet Module."""
    out = symbol.get_internals()[layer + "_output"]
    both = forward(out, arg_params, aux_params, pixels) + forward(out, arg_params, aux_params, pixels[:, :, :, ::-1].copy())
    return both / np.linalg.norm(both, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["graph", "raw", "training"])
def test_embed_finds_fc1_and_normalises_as_the_graph_needs(originals, kind, tmp_path):
    """Test that embed takes fc1_output of an original-naming model (also of its training symbol,
    whose outputs are fc1 and a softmax), feeds raw pixels to a graph that normalises them and
    (x - 127.5) / 128 to one that does not, says which, and writes the model's embeddings."""
    root, models = originals
    result = run_tool("sample_fc.tools.embed", "--model", root / kind, "--images", root / "images",
                      "--out", tmp_path / "emb.npy")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("model "))
    assert "output fc1_output" in line and f"input {SIZE}x{SIZE}" in line, line
    pixels = folder_pixels(root / "images")
    if kind == "raw":
        assert "(x - 127.5) / 128 applied before the graph" in line, line
        pixels = (pixels - 127.5) / 128
    else:
        assert "the graph normalises raw pixels" in line, line
    want = fc1_embeddings(*models[kind], pixels)
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), want, rtol=0, atol=1e-5)


def test_output_names_another_layer_and_a_wrong_name_is_one_line(originals, tmp_path):
    """Test that --output pre_fc1 embeds with that layer, and --output of a layer the graph
    lacks is one line naming it and the graph's outputs, exit 2 (the tools' error exit), nothing written."""
    root, models = originals
    result = run_tool("sample_fc.tools.embed", "--model", root / "graph", "--images", root / "images",
                      "--out", tmp_path / "pre.npy", "--output", "pre_fc1")
    assert result.returncode == 0 and "output pre_fc1_output" in result.stdout, result.stderr
    want = fc1_embeddings(*models["graph"], folder_pixels(root / "images"), layer="pre_fc1")
    np.testing.assert_allclose(np.load(tmp_path / "pre.npy"), want, rtol=0, atol=1e-5)
    result = run_tool("sample_fc.tools.embed", "--model", root / "graph", "--images", root / "images",
                      "--out", tmp_path / "bad.npy", "--output", "fc5")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "--output fc5" in lines[0] and "fc1_output" in lines[0], lines[0]
    assert not (tmp_path / "bad.npy").exists()


def test_verify_and_export_run_on_an_original_model(originals, tmp_path):
    """Test that verify scores an original-naming model on a .bin (saying which output it used)
    and export writes an ONNX file that its onnxruntime check finds equal to MXNet."""
    root, _ = originals
    result = run_tool("sample_fc.tools.verify", "--model", f"{root / 'training'},1", "--bin", root / "pairs.bin")
    assert result.returncode == 0, result.stderr
    assert "output fc1_output" in result.stdout and "pairs: accuracy" in result.stdout, result.stdout
    result = run_tool("sample_fc.tools.export", "--model", root / "raw", "--onnx", tmp_path / "raw.onnx")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "(x - 127.5) / 128 applied" in result.stdout and (tmp_path / "raw.onnx").is_file()


def our_embeddings(weights, pixels):
    symbol = symbols.get_symbol("r18", DIM, SIZE)
    return forward(symbol, *weights, pixels)


def test_pretrained_maps_an_original_model_by_structure(originals):
    """Test that --pretrained's loader maps an original-naming r18 onto sample_fc's r18 by
    structure (every parameter, BN statistics included), so the network gives the source
    model's embeddings, and says so in one note naming the source's unused parameters (none
    for the model, the training head's fc7 for the training symbol)."""
    root, models = originals
    pixels = np.random.default_rng(5).uniform(0, 255, (4, 3, SIZE, SIZE)).astype(np.float32)
    for kind, unused in (("graph", "not used: none"), ("training", "not used: fc7_weight, fc7_bias")):
        notes = []
        weights = load_pretrained(str(root / kind), symbols.get_symbol("r18", DIM, SIZE), SIZE, "r18", notes.append)
        symbol, arg_params, aux_params = models[kind]
        want = forward(symbol.get_internals()["fc1_output"], arg_params, aux_params, pixels)
        got = our_embeddings(weights, pixels)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
        assert len(notes) == 1 and "matched by structure" in notes[0] and "conv0_weight -> stem_conv_weight" in notes[0]
        assert unused in notes[0], notes[0]


def test_pretrained_of_another_architecture_names_what_did_not_map(originals):
    """Test that an original-naming r18 offered to an r34 (more units) or at another embedding
    size is one UsageError naming a parameter of ours without a counterpart."""
    root, _ = originals
    with pytest.raises(UsageError, match=r"by structure either: \d+ of its \d+ parameters have no counterpart, the first stage"):
        load_pretrained(str(root / "graph"), symbols.get_symbol("r34", DIM, SIZE), SIZE, "r34")
    with pytest.raises(UsageError, match=r"the first embedding_fc_weight \(32, 2048\)"):
        load_pretrained(str(root / "graph"), symbols.get_symbol("r18", 32, SIZE), SIZE, "r18")
