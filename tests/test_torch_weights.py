"""arcface_torch's backbone.pth (sample_fc/models/torch_weights.py reads it, torch_backbone.py maps it
onto our networks): state dicts of arcface_torch's r50 and mbf saved by torch
(tests/workers/arcface_torch_models.py, a process of its own: torch cannot be imported after
horovod.mxnet) are read exactly, give the torch networks' embeddings in the tools and start
train.py --pretrained; files that are no state dict are one line, and nothing in them runs."""
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from collections import OrderedDict

import mxnet as mx
import numpy as np
import pytest

from sample_fc import symbols
from conftest import REPO, per_rank_tail, run_train
from original_models import forward
from sample_fc.models import torch_backbone
from sample_fc.errors import MissingFileError, UsageError
from bench.harness import single_thread_env
from sample_fc.models.saved_model import load_model, load_pretrained
from sample_fc.tools import embed
from sample_fc.models.torch_weights import read_state_dict
from test_bin_format import payloads
from test_tools import write_faces

SIZE, RANDOM_IMAGES, FACES = 112, 3, 3


def normalised(rows):
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The worker's files (see its docstring) for 3 random images, 3 face images as
    tools.embed reads them, and their mirrors; and the faces' folder, images/."""
    root = tmp_path_factory.mktemp("arcface_torch")
    write_faces(str(root / "images"), FACES, seed=4)
    faces = np.stack([embed.read_image(str(root / "images" / p), SIZE)
                      for p in embed.list_images(str(root / "images"))]).transpose(0, 3, 1, 2)
    random = np.random.default_rng(7).uniform(0, 255, (RANDOM_IMAGES, 3, SIZE, SIZE))
    np.save(root / "pixels.npy", np.concatenate([random, faces, faces[:, :, :, ::-1]]).astype(np.float32))
    result = subprocess.run([sys.executable, str(REPO / "tests" / "workers" / "arcface_torch_models.py"),
                             str(root), str(root / "pixels.npy")], capture_output=True, text=True,
                            timeout=300, cwd=str(REPO), env=single_thread_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.mark.parametrize("name", ["r50", "mbf", "views"])
def test_reader_returns_the_state_dicts_tensors(files, name):
    """Test that read_state_dict gives every tensor of a torch-saved state dict under its key,
    in order, with its dtype, shape and values (float32, int64 num_batches_tracked; float16,
    bfloat16 as float32, strided views and an offset into a shared storage, a scalar, an empty
    tensor), each a C-contiguous array of its own."""
    got, want = read_state_dict(str(files / f"{name}.pth")), np.load(files / f"{name}.npz")
    assert list(got) == list(want.files)
    for key in want.files:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
        assert got[key].flags.c_contiguous and got[key].flags.owndata, key


def test_name_map_covers_every_network():
    """Test that torch_backbone's name map gives every parameter and BN statistic of each of
    symbols.NETWORKS one distinct arcface_torch key, and nothing else."""
    for network in symbols.NETWORKS:
        symbol = symbols.get_symbol(network, 8, 32)
        names = torch_backbone.parameter_names(network)
        ours = sorted(n for n in symbol.list_arguments() + symbol.list_auxiliary_states() if n != "data")
        assert sorted(mine for mine, _, _ in names) == ours, network
        assert len({theirs for _, theirs, _ in names}) == len(names), network


@pytest.mark.parametrize("name", ["r50", "mbf", "vit_t"])
def test_pth_model_gives_the_torch_networks_embeddings(files, name):
    """Test that --model backbone.pth (no --network; a ViT's variants share its tensors, so it is
    named) picks the network the file holds, says so, and its embeddings of raw pixels equal the
    torch network's of arcface_torch's (x / 255 - 0.5) / 0.5 within 1e-4 (normalised; raw: 1e-4
    of their largest value)."""
    if name == "vit_t":
        with pytest.raises(UsageError, match="fits several of sample_fc's networks .*vit_t, vit_t_dp005_mask0"):
            load_model(str(files / f"{name}.pth"))
    model = load_model(str(files / f"{name}.pth"), network="vit_t") if name == "vit_t" else \
        load_model(str(files / f"{name}.pth"))
    if name != "vit_t":
        assert model.line().startswith(f"model {files / name}.pth (arcface_torch {name}: the one network whose")
    assert (model.image_size, model.output, model.config) == (SIZE, "embeddings_output", None)
    want = np.load(files / f"{name}_embeddings.npy")
    got = forward(model.symbol, model.arg_params, model.aux_params, np.load(files / "pixels.npy"))
    assert want.shape == (RANDOM_IMAGES + 2 * FACES, 512) and np.abs(want).max() > 1e-2
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(normalised(got), normalised(want), rtol=0, atol=1e-4)
    assert (normalised(got) * normalised(want)).sum(axis=1).min() >= 0.99999


def run_tool(module, *args):
    return subprocess.run([sys.executable, "-m", module] + [str(a) for a in args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=300, env=single_thread_env())


def test_embed_tool_on_a_pth(files, tmp_path):
    """Test that `tools.embed --model mbf.pth --network mbf` writes the torch network's
    flip-summed L2-normalised embeddings of the folder's images (within 1e-4)."""
    result = run_tool("sample_fc.tools.embed", "--model", files / "mbf.pth", "--network", "mbf",
                      "--images", files / "images", "--out", tmp_path / "emb.npy", "--batch-size", FACES)
    assert result.returncode == 0, result.stderr
    assert f"model {files / 'mbf.pth'} (arcface_torch mbf: --network): output embeddings_output" in result.stdout
    rows = np.load(files / "mbf_embeddings.npy")[RANDOM_IMAGES:]
    want = normalised(rows[:FACES] + rows[FACES:])
    np.testing.assert_allclose(np.load(tmp_path / "emb.npy"), want, rtol=0, atol=1e-4)


def test_a_pth_of_another_network_is_one_line(files):
    """Test that a file read as a network it does not hold, one fitting none of ours, and a
    --pretrained of another network or embedding size are one UsageError naming the file and
    the first tensor that differs."""
    with pytest.raises(UsageError, match=r"mbf.pth does not hold arcface_torch's mbf_small: layers.0.layers.0.weight "
                                         r"has shape \(128, 3, 3, 3\), mbf_small needs \(64, 3, 3, 3\)"):
        load_model(str(files / "mbf.pth"), network="mbf_small")
    with pytest.raises(UsageError, match=r"views.pth holds none of sample_fc's networks; closest: vit_t_dp005_mask0 \(\d+ tensors "
                                         r"differ, first patch_embed.proj.weight is missing\)"):      # the fewest tensors
        load_model(str(files / "views.pth"))
    with pytest.raises(UsageError, match=r"r50.pth does not hold arcface_torch's r100: layer2.4.bn1.weight is missing"):
        load_pretrained(str(files / "r50.pth"), symbols.get_symbol("r100", 512, SIZE), SIZE, "r100")
    with pytest.raises(UsageError, match=r"does not fit this run's network 'r50' at 112 px: embedding_fc_bias has "
                                         r"shape \(512,\), this run needs \(256,\)"):
        load_pretrained(str(files / "r50.pth"), symbols.get_symbol("r50", 256, SIZE), SIZE, "r50")


def test_train_starts_from_a_pth(files, tiny_data, tmp_path):
    """Test that train.py --pretrained arcface_torch.pth (an mbf_small at 32 px, D 32: the tiny
    run's network) trains a step and its first checkpoint holds the file's weights (lr 1e-9),
    each where the name map puts it: the stem conv scaled by 128 / 127.5, PReLU slopes as
    (C, 1, 1, 1), the FC scaled by the features BatchNorm's gamma."""
    state = read_state_dict(str(files / "mbf_small32.pth"))
    root = tmp_path / "run"
    result = run_train(root, tiny_data, "--set", "max_update=1", "--set", "lr=1e-9",
                       "--pretrained", files / "mbf_small32.pth", num_proc=1)
    assert result.returncode == 0, per_rank_tail(result.output)
    assert "arcface_torch's mbf_small, " in result.output, result.output[-3000:]
    _, started, _ = mx.model.load_checkpoint(str(root / "step-00000001" / "model"), 1)
    expected = {"stem_conv_weight": state["layers.0.layers.0.weight"] * (128 / 127.5),
                "stage2_unit3_expand_prelu_gamma": state["layers.5.layers.2.layers.0.layers.2.weight"][:, None, None, None],
                "stage3_down_project_bn_beta": state["layers.6.layers.2.layers.1.bias"],
                "gdc_conv_weight": state["features.layers.0.layers.0.weight"],
                "embedding_fc_weight": state["features.layers.2.weight"] * state["features.layers.3.weight"][:, None]}
    for name, value in expected.items():
        np.testing.assert_allclose(started[name].asnumpy(), value, rtol=1e-5, atol=1e-6, err_msg=name)
    mapped = torch_backbone.load(str(files / "mbf_small32.pth"), "mbf_small").arg_params
    assert sorted(mapped) == sorted(started)
    for name in mapped:
        np.testing.assert_allclose(started[name].asnumpy(), mapped[name].asnumpy(), rtol=0, atol=1e-6, err_msg=name)


def test_a_data_parallel_state_dict_loads_as_the_plain_one(files):
    """Test that a state dict saved from nn.DataParallel (keys "module.*") maps as the plain one."""
    plain = torch_backbone.load(str(files / "mbf_small32.pth"))
    wrapped = torch_backbone.load(str(files / "data_parallel.pth"))
    assert (wrapped.network, wrapped.embedding_size, wrapped.image_size) == ("mbf_small", 32, 32)
    for name, value in list(plain.arg_params.items()) + list(plain.aux_params.items()):
        mine = wrapped.arg_params.get(name, wrapped.aux_params.get(name))
        np.testing.assert_array_equal(mine.asnumpy(), value.asnumpy(), err_msg=name)


def handmade_pth(path, data_pkl, storages=None):
    """A zip archive as torch.save writes one, with this data.pkl and storages {key: bytes}."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("backbone/data.pkl", data_pkl)
        archive.writestr("backbone/byteorder", "little")
        for key, raw in (storages or {}).items():
            archive.writestr(f"backbone/data/{key}", raw)
        archive.writestr("backbone/version", "3\n")
    return str(path)


def one_tensor_pkl(size, stride, numel):
    """data.pkl (pickle protocol 2, as torch writes it) of {'w': _rebuild_tensor_v2 of a
    float32 storage '0' of `numel` elements, offset 0, `size` and `stride`}."""
    def text(value):
        return b"X" + struct.pack("<I", len(value)) + value.encode()

    def ints(values):
        return b"(" + b"".join(b"K" + bytes([v]) for v in values) + b"t"
    return (b"\x80\x02ccollections\nOrderedDict\n)R(" + text("w") + b"ctorch._utils\n_rebuild_tensor_v2\n(" +
            b"(" + text("storage") + b"ctorch\nFloatStorage\n" + text("0") + text("cpu") + b"K" + bytes([numel]) +
            b"tQK\x00" + ints(size) + ints(stride) + b"\x89ccollections\nOrderedDict\n)RtRu.")


def test_a_handmade_tensor_reads_and_a_view_outside_its_storage_is_refused(tmp_path):
    """Test that a hand-written data.pkl of one tensor reads as the view it describes, and one
    whose view reaches past its storage, repeats its elements (stride 0), or whose storage is
    short, is one UsageError."""
    storage = {"0": np.arange(6, dtype="<f4").tobytes()}
    path = handmade_pth(tmp_path / "good.pth", one_tensor_pkl((2, 2), (1, 3), 6), storage)
    np.testing.assert_array_equal(read_state_dict(path)["w"], [[0, 3], [1, 4]])
    for name, data, message in (("outside", one_tensor_pkl((3, 2), (3, 1), 6), "reaches element 7 of a storage of 6"),
                                ("repeated", one_tensor_pkl((4, 2), (0, 1), 6), "holds more elements than its storage"),
                                ("short", one_tensor_pkl((2, 2), (2, 1), 8), "holds 24 bytes, not 8 elements")):
        with pytest.raises(UsageError, match=f"{name}.pth: not a readable PyTorch state dict .*{message}"):
            read_state_dict(handmade_pth(tmp_path / f"{name}.pth", data, storage))


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval"])
def test_a_pth_that_calls_a_function_is_refused_and_nothing_runs(tmp_path, kind):
    """Test that a .pth whose state dict holds a call of os.system or builtins.eval (after a
    real tensor entry) is refused naming the global, and the command never runs."""
    marker = tmp_path / "pwned"
    payload, name, old_name = payloads(marker)[kind]
    path = handmade_pth(tmp_path / "evil.pth", pickle.dumps(OrderedDict([("a", 1.0), ("w", payload)]), protocol=2))
    with pytest.raises(UsageError) as raised:
        read_state_dict(path)
    message = str(raised.value)
    assert f"{path}: not a state dict: refused to call {old_name}" in message and "\n" not in message, message
    assert "nothing in the file was run" in message and not marker.exists()


def test_a_tool_refuses_a_pth_that_runs_a_command(tmp_path):
    """Test that tools.embed on such a .pth (os.system) exits 2 with one line naming the file
    and the global, and the command never runs."""
    marker = tmp_path / "pwned"
    payload, name, _ = payloads(marker)["os.system"]
    path = handmade_pth(tmp_path / "backbone.pth", pickle.dumps(OrderedDict(w=payload), protocol=4))
    (tmp_path / "images").mkdir()
    result = run_tool("sample_fc.tools.embed", "--model", path, "--images", tmp_path / "images", "--out",
                      tmp_path / "emb.npy")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"--model {path}: not a state dict: refused to call {name}" in lines[0], lines[0]
    assert not marker.exists() and not (tmp_path / "emb.npy").exists()


def test_legacy_garbage_whole_model_and_missing_files_are_one_line(files, tmp_path):
    """Test that a file in torch's legacy format, one that is not a PyTorch file, a truncated
    archive, a whole pickled model (torch.save(model)) and a missing file are each one
    UsageError naming the file (the missing one a MissingFileError)."""
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(os.urandom(1000))
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes((files / "mbf_small32.pth").read_bytes()[:100000])
    cases = {files / "legacy.pth": "a PyTorch file in the legacy format (torch < 1.6), which is not supported",
             garbage: "not a PyTorch file", truncated: "not a PyTorch file",
             files / "whole_model.pth": "not a state dict: refused to call __main__.MobileFaceNet"}
    for path, message in cases.items():
        with pytest.raises(UsageError) as raised:
            load_model(str(path))
        assert f"--model {path}: {message}" in str(raised.value) and "\n" not in str(raised.value), raised.value
    with pytest.raises(MissingFileError, match=f"--pretrained {tmp_path / 'none.pth'}: no such file"):
        load_pretrained(str(tmp_path / "none.pth"), symbols.get_symbol("mbf_small", 32, 32), 32, "mbf_small")


def test_a_pth_whose_member_header_disagrees_is_one_short_line(tmp_path):
    """Test that a .pth whose zip member header no longer matches its directory entry (a flipped
    byte in the header's name length) is a UsageError of one short line naming the file, not
    zipfile's message quoting kilobytes of the file's bytes."""
    import re
    data = one_tensor_pkl((2, 2), (2, 1), 4) * 40          # a long data.pkl (the quote grows with it)
    path = handmade_pth(tmp_path / "model.pth", data, {"0": np.arange(4, dtype="<f4").tobytes()})
    raw = bytearray(open(path, "rb").read())
    struct.pack_into("<H", raw, 26, struct.unpack_from("<H", raw, 26)[0] + 200)   # local header: name length
    open(path, "wb").write(bytes(raw))
    with pytest.raises(UsageError) as raised:
        read_state_dict(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: not a readable PyTorch state dict (")
    assert "\n" not in message and len(message) < 500, message[:1000]
    assert re.search(r"BadZipFile", message)
