"""Tests for the command-line tools sample_fc.tools.make_bin, .verify, .embed, model_io and cli."""
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

from sample_fc import symbols
from sample_fc.tools import cli, embed, make_bin, model_io
from sample_fc.data.bin_format import load_bin
from sample_fc.errors import MissingFileError, UsageError
from bench.harness import single_thread_env
from sample_fc.verification import Embedder, evaluate

REPO = Path(__file__).resolve().parents[1]
SIZE, DIM, STEP, TRAIN_BATCH = 32, 16, 300, 8


def random_backbone(network, embedding_size, image_size, seed=0):
    """(symbol, arg_params, aux_params) of a randomly initialised backbone that behaves like a
    trained one in inference mode: He-initialised weights, hidden BatchNorms with non-trivial
    statistics, and the final BatchNorm's statistics taken from a batch of random pixels (so
    embeddings vary from image to image with components of order 1)."""
    symbol = symbols.get_symbol(network, embedding_size=embedding_size, image_size=image_size)
    module = mx.mod.Module(symbol, data_names=("data",), label_names=None)
    module.bind(data_shapes=[("data", (8, 3, image_size, image_size))], for_training=False)
    mx.random.seed(seed)
    module.init_params(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    arg_params, aux_params = module.get_params()
    rng = np.random.default_rng(seed)
    for name, value in aux_params.items():
        stats = rng.normal(0, 0.1, value.shape) if name.endswith("mean") else rng.uniform(0.5, 2, value.shape)
        aux_params[name] = mx.nd.array(stats)
    aux_params["embeddings_moving_mean"] = mx.nd.zeros((embedding_size,))
    aux_params["embeddings_moving_var"] = mx.nd.ones((embedding_size,))
    module.set_params(arg_params, aux_params)
    pixels = rng.uniform(0, 255, (8, 3, image_size, image_size)).astype(np.float32)
    module.forward(mx.io.DataBatch([mx.nd.array(pixels)]), is_train=False)
    features = module.get_outputs()[0].asnumpy()
    aux_params["embeddings_moving_mean"] = mx.nd.array(features.mean(axis=0))
    aux_params["embeddings_moving_var"] = mx.nd.array(features.var(axis=0) + 1e-3)
    return symbol, arg_params, aux_params


def tiny_model(folder, seed=0):
    """A random mbf (D=16, 32x32) saved as a training checkpoint is: folder/model-0300.params
    and a state.json naming the training batch size."""
    symbol, arg_params, aux_params = random_backbone("mbf", DIM, SIZE, seed)
    os.makedirs(folder, exist_ok=True)
    mx.model.save_checkpoint(os.path.join(folder, "model"), STEP, symbol, arg_params, aux_params)
    with open(os.path.join(folder, "state.json"), "w") as handle:
        json.dump({"step": STEP, "config": {"batch_size": TRAIN_BATCH, "image_size": SIZE}}, handle)
    return symbol, arg_params, aux_params


def face_like(rng, side, base=None):
    """A smooth random RGB image (side x side), or a noisy copy of `base` (a 4x4x3 grid)."""
    grid = rng.integers(0, 256, (4, 4, 3)) if base is None else base + rng.normal(0, 25, base.shape)
    image = Image.fromarray(np.clip(grid, 0, 255).astype(np.uint8)).resize((side, side), Image.BILINEAR)
    return image, grid


def write_faces(folder, count, seed=0):
    """`count` random images: even ones 32x32 PNG, odd ones 40x40 JPEG; returns file names."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(count):
        names.append(f"face{i:02d}." + ("png" if i % 2 == 0 else "jpg"))
        face_like(rng, SIZE if i % 2 == 0 else 40)[0].save(os.path.join(folder, names[-1]))
    return names


def write_pairs(folder, pairs, seed=0):
    """pairs.txt of `pairs` pairs under folder/faces, odd pairs 'same' (the second image a
    noisy, larger copy of the first), even ones of two unrelated images."""
    rng = np.random.default_rng(seed)
    (folder / "faces").mkdir()
    lines = []
    for i in range(pairs):
        first, grid = face_like(rng, SIZE)
        second, _ = face_like(rng, 40, base=grid if i % 2 else None)
        first.save(folder / "faces" / f"{i:02d}a.png")
        second.save(folder / "faces" / f"{i:02d}b.jpg")
        lines.append(f"faces/{i:02d}a.png faces/{i:02d}b.jpg {i % 2}")
    (folder / "pairs.txt").write_text("# a comment\n\n" + "\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A models root with one complete checkpoint, 40 images, and a 20-pair .bin of them."""
    root = tmp_path_factory.mktemp("tools")
    checkpoint = root / "models" / f"step-{STEP:08d}"
    symbol, arg_params, aux_params = tiny_model(str(checkpoint))
    (checkpoint / "COMPLETE").write_text("{}")
    write_pairs(root, 20)
    bin_path = root / "pairs.bin"
    assert make_bin.make_bin(str(root / "pairs.txt"), str(bin_path), image_size=SIZE) == 20
    return dict(root=root, models=root / "models", checkpoint=checkpoint, bin=bin_path,
                symbol=symbol, arg_params=arg_params, aux_params=aux_params)


def run_tool(module, *args):
    return subprocess.run([sys.executable, "-m", module] + [str(a) for a in args], cwd=str(REPO),
                          capture_output=True, text=True, timeout=120, env=single_thread_env())


def test_make_bin_round_trips_images_and_flags(workspace):
    """Test that make_bin keeps a JPEG/PNG of the right size byte for byte, resizes the others
    to --image-size, and stores the issame flags in order."""
    with open(workspace["bin"], "rb") as handle:
        encoded, flags = pickle.load(handle)
    assert encoded[0] == (workspace["root"] / "faces" / "00a.png").read_bytes()
    assert Image.open(io.BytesIO(encoded[1])).format == "JPEG"
    images, issame = load_bin(str(workspace["bin"]))
    assert images.shape == (40, SIZE, SIZE, 3)
    assert issame.tolist() == flags == [i % 2 == 1 for i in range(20)]


def test_make_bin_errors_name_the_line_and_path(tmp_path, capsys):
    """Test that make_bin exits 2 naming the line and path of a missing image, a malformed
    line, and images of different sizes without --image-size."""
    write_faces(str(tmp_path), 3)
    enough = "".join(f"face00.png face02.png {i % 2}\n" for i in range(9))     # 32x32 both
    cases = {"face00.png missing.png 1\n" + enough: ["pairs.txt:1", "missing.png"],
             "face00.png face01.jpg 1\nface00.png 2\n": ["pairs.txt:2", "face00.png 2"],
             "face00.png face01.jpg 0\n" + enough: ["pairs.txt:1", "face01.jpg", "--image-size"]}
    for text, wanted in cases.items():
        (tmp_path / "pairs.txt").write_text(text)
        with pytest.raises(SystemExit) as stop:
            make_bin.main(["--pairs", str(tmp_path / "pairs.txt"), "--out", str(tmp_path / "x.bin")])
        assert stop.value.code == 2
        message = capsys.readouterr().err
        assert all(w in message for w in wanted), message
    assert not (tmp_path / "x.bin").exists()


def test_model_spec_resolves_checkpoints_and_infers_image_size(workspace, tmp_path):
    """Test that --model accepts a prefix, a prefix with epoch, a checkpoint dir and a models
    root (newest complete checkpoint, never .partial or incomplete ones), and that the input
    size is inferred from the params."""
    for name in ("step-00000100", "step-00000200", "step-00000300.partial", "step-00000400"):
        (tmp_path / name).mkdir()
    for name in ("step-00000100", "step-00000200"):
        (tmp_path / name / "COMPLETE").write_text("{}")
    assert model_io.resolve_prefix(str(tmp_path)) == str(tmp_path / "step-00000200" / "model")
    assert model_io.resolve_prefix(str(tmp_path), 100) == str(tmp_path / "step-00000100" / "model")
    with pytest.raises(FileNotFoundError, match="step-00000300/"):
        model_io.resolve_prefix(str(tmp_path), 300)
    prefix = str(workspace["checkpoint"] / "model")
    for spec in (prefix, prefix + f",{STEP}", str(workspace["checkpoint"]), str(workspace["models"]),
                 str(workspace["models"]) + f",{STEP}"):
        model = model_io.load_model(spec)
        assert (model.prefix, model.epoch, model.image_size) == (prefix, STEP, SIZE)
        assert model.config["batch_size"] == TRAIN_BATCH
    with pytest.raises(ValueError, match="do not fit 64x64"):
        model_io.load_model(prefix, image_size=64)
    with pytest.raises(FileNotFoundError, match="model-0007.params"):
        model_io.load_model(prefix + ",7")


def test_verify_prints_what_evaluate_with_embedder_gives(workspace):
    """Test that `python -m sample_fc.tools.verify` prints exactly the line of verification.evaluate
    with an Embedder of the same params and training's batch size, plus the baseline."""
    result = run_tool("sample_fc.tools.verify", "--model", workspace["models"], "--bin", workspace["bin"],
                      "--baseline")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert f"batch size {TRAIN_BATCH}" in lines[0]
    images, issame = load_bin(str(workspace["bin"]), SIZE)
    embedder = Embedder(workspace["symbol"], workspace["arg_params"], workspace["aux_params"],
                        mx.cpu(), SIZE, batch_size=TRAIN_BATCH)
    assert lines[1] == evaluate(embedder, images, issame).line("pairs")
    assert lines[2].startswith("pairs raw-pixel baseline: accuracy ")


def test_verify_errors_name_the_bad_path(workspace, tmp_path):
    """Test that verify exits 2 naming the path for a missing .bin and a bad model prefix."""
    missing_bin = tmp_path / "nope.bin"
    result = run_tool("sample_fc.tools.verify", "--model", workspace["models"], "--bin", missing_bin)
    assert result.returncode == 2 and str(missing_bin) in result.stderr, result.stderr
    bad_prefix = tmp_path / "no_model"
    result = run_tool("sample_fc.tools.verify", "--model", bad_prefix, "--bin", workspace["bin"])
    assert result.returncode == 2 and str(bad_prefix) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_embed_rows_equal_normalised_embedder_outputs(workspace, tmp_path):
    """Test that embed writes, for the images of a folder (recursive, sorted), the L2-normalised
    Embedder outputs (flip-summed, or not with --no-flip) and their paths in row order."""
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    names = write_faces(str(folder / "sub"), 3, seed=1) + write_faces(str(folder), 2, seed=2)
    (folder / "notes.txt").write_text("not an image")
    for flip in (True, False):
        embedder = Embedder(workspace["symbol"], workspace["arg_params"], workspace["aux_params"],
                            mx.cpu(), SIZE, batch_size=2, flip=flip)
        out = tmp_path / f"emb{flip}.npy"
        embed.main(["--model", str(workspace["models"]), "--images", str(folder), "--out", str(out),
                    "--batch-size", "2"] + ([] if flip else ["--no-flip"]))
        paths = (tmp_path / f"emb{flip}.txt").read_text().splitlines()
        assert paths == sorted(names[3:] + ["sub/" + n for n in names[:3]])
        pixels = np.stack([embed.read_image(str(folder / p), SIZE) for p in paths])
        pixels = pixels.transpose(0, 3, 1, 2).astype(np.float32)
        want = embedder(pixels)
        want /= np.linalg.norm(want, axis=1, keepdims=True)
        got = np.load(out)
        assert got.shape == (5, DIM) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    flipped, plain = np.load(tmp_path / "embTrue.npy"), np.load(tmp_path / "embFalse.npy")
    assert np.abs(flipped - plain).max() > 1e-3


def test_embed_errors_name_the_bad_path(workspace, tmp_path, capsys):
    """Test that embed exits 2 naming a missing folder and an undecodable image."""
    missing = tmp_path / "missing"
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bad.jpg").write_bytes(b"not a jpeg")
    for folder, wanted in ((missing, str(missing)), (tmp_path / "broken", "bad.jpg")):
        with pytest.raises(SystemExit) as stop:
            embed.main(["--model", str(workspace["models"]), "--images", str(folder),
                        "--out", str(tmp_path / "e.npy")])
        assert stop.value.code == 2
        assert wanted in capsys.readouterr().err


def test_a_bug_in_a_tool_keeps_its_traceback(capsys):
    """Test that a bug in a tool keeps its traceback: run_or_exit lets a plain ValueError or
    OSError out of work() as it is, and turns only a UsageError into one line and exit 2."""
    parser = cli.make_parser("sample_fc.tools.some_tool", "a tool")

    def raising(error):
        def work():
            raise error
        return work

    for bug in (ValueError("a programming mistake"), FileNotFoundError(2, "No such file", "x.txt")):
        with pytest.raises(type(bug)) as raised:
            cli.run_or_exit(parser, raising(bug))
        assert raised.value is bug
    for mistake in (UsageError("--model m: no such thing"), MissingFileError("--bin b.bin: no such file")):
        with pytest.raises(SystemExit) as stop:
            cli.run_or_exit(parser, raising(mistake))
        assert stop.value.code == 2
        assert capsys.readouterr().err == f"python -m sample_fc.tools.some_tool: error: {mistake}\n"
    assert cli.run_or_exit(parser, lambda: 7) == 7


def test_unloadable_params_and_missing_inputs_are_usage_errors(workspace, tmp_path):
    """Test that a .params MXNet refuses to load is a UsageError carrying MXNet's reason (the
    last line of its message, not its C++ traceback), and that a missing pairs file, an output
    folder that does not exist and a GPU MXNet does not see are UsageErrors naming them."""
    prefix = tmp_path / "model"
    (tmp_path / "model-symbol.json").write_bytes((workspace["checkpoint"] / "model-symbol.json").read_bytes())
    (tmp_path / f"model-{STEP:04d}.params").write_bytes(b"not an NDArray file" * 10)
    with pytest.raises(UsageError) as raised:
        model_io.load_model(str(prefix))
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message and str(prefix) in message
    assert "Invalid NDArray file format" in message, message
    with pytest.raises(MissingFileError, match="no_pairs.txt"):
        make_bin.make_bin(str(tmp_path / "no_pairs.txt"), str(tmp_path / "x.bin"))
    write_faces(str(tmp_path), 2)
    (tmp_path / "pairs.txt").write_text("face00.png face01.jpg 1\n")
    with pytest.raises(MissingFileError, match="no_folder"):
        make_bin.make_bin(str(tmp_path / "pairs.txt"), str(tmp_path / "no_folder" / "x.bin"), image_size=SIZE)
    if mx.context.num_gpus() == 0:
        with pytest.raises(UsageError, match="--context gpu:0: MXNet sees 0 GPU"):
            model_io.check_context(mx.gpu(0))


def test_tools_do_not_import_horovod():
    """Test that importing the tools loads neither Horovod nor sample_fc.dist."""
    code = ("import sys, sample_fc.tools.verify, sample_fc.tools.embed, sample_fc.tools.export, sample_fc.tools.make_bin; "
            "bad = [m for m in sys.modules if m.startswith(('horovod', 'sample_fc.dist'))]; "
            "assert not bad, bad")
    result = subprocess.run([sys.executable, "-c", code], cwd=str(REPO), capture_output=True,
                            text=True, timeout=120, env=single_thread_env())
    assert result.returncode == 0, result.stderr[-3000:]


# ---- tools at real scale (issue 44) ------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_is_a_line_every_interval_with_count_rate_and_time_left():
    """Test that Progress, the one reporter of the tools, writes (not on a terminal) one line per
    interval with the count, the rate and the time left, and one final line with the total
    time: 100 s of work at 10 images/s give 10 lines, not one per update."""
    clock, stream = FakeClock(), io.StringIO()
    bar = cli.Progress(1000, "embedding", stream=stream, clock=clock)
    for _ in range(100):
        clock.now += 1.0
        bar.update(10)
    lines = stream.getvalue().splitlines()
    assert 9 <= len(lines) <= 11, lines
    assert lines[0] == "embedding: 100/1,000 images (10%), 10.0 images/s, 1m30s left"
    assert lines[-1] == "embedding: 1,000 images in 1m40s, 10.0 images/s"
    bar.update(0)                                            # nothing more after the end
    assert stream.getvalue().splitlines() == lines
    quiet = io.StringIO()
    cli.Progress(5, "x", enabled=False, stream=quiet, clock=clock).update(5)
    assert quiet.getvalue() == ""


def test_outputs_are_checked_writable_before_any_work(workspace, tmp_path, monkeypatch, capsys):
    """Test that every tool that writes refuses, before loading a model or reading an image, an
    output it cannot write: a folder that does not exist, one that takes no file (/proc/1),
    a directory given as the file, or a parent that is a file; exit 2, one line naming it."""
    def no_work(*args, **kwargs):
        raise AssertionError("work started before the output was checked")
    from sample_fc.tools import demo_data, export, ijb, pack, verify  # noqa: F401
    for tool in (embed, export, ijb):
        monkeypatch.setattr(tool, "load_model_from_args", no_work)
    monkeypatch.setattr(make_bin, "encode_image", no_work)
    monkeypatch.setattr(demo_data, "make_demo", no_work)
    write_pairs(tmp_path, 10)
    (tmp_path / "a_file").write_text("x")
    model, images, pairs = str(workspace["models"]), str(tmp_path / "faces"), str(tmp_path / "pairs.txt")
    cases = [(embed, ["--model", model, "--images", images, "--out", str(tmp_path / "missing" / "e.npy")], "missing"),
             (embed, ["--model", model, "--images", images, "--out", "/proc/1/e.npy"], "cannot write in /proc/1"),
             (embed, ["--model", model, "--images", images, "--out", str(tmp_path / "dir.npy")], "is a directory"),
             (export, ["--model", model, "--onnx", "/proc/1/m.onnx"], "cannot write in /proc/1"),
             (make_bin, ["--pairs", pairs, "--out", "/proc/1/x.bin"], "cannot write in /proc/1"),
             (pack, ["--images", str(tmp_path), "--out", "/proc/1/set/train"], "cannot write in /proc/1"),
             (demo_data, ["--out", str(tmp_path / "a_file" / "demo")], "is a file, not a directory"),
             (ijb, ["--model", model, "--root", str(tmp_path), "--out", "/proc/1/ijb"], "cannot write in /proc/1")]
    (tmp_path / "dir.npy").mkdir()
    for tool, argv, wanted in cases:
        with pytest.raises(SystemExit) as stop:
            tool.main(argv)
        error = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(error) == 1 and wanted in error[0], (tool.__name__, error)


def test_embed_skip_bad_leaves_out_and_counts_undecodable_images(workspace, tmp_path, capsys):
    """Test that embed stops at an undecodable image naming it and --skip-bad (exit 2), and with
    --skip-bad leaves it out of both files and says how many it skipped; progress lines go
    to stderr."""
    folder = tmp_path / "images"
    names = write_faces(str(folder), 4, seed=3)
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    out = tmp_path / "e.npy"
    argv = ["--model", str(workspace["models"]), "--images", str(folder), "--out", str(out), "--batch-size", "2"]
    with pytest.raises(SystemExit) as stop:
        embed.main(argv)
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "broken.jpg" in error and "--skip-bad" in error
    assert embed.main(argv + ["--skip-bad"]) == 0
    err = capsys.readouterr().err
    assert np.load(out).shape == (4, DIM)
    assert (tmp_path / "e.txt").read_text().splitlines() == sorted(names)
    assert f"skipped 1 unreadable images: {folder / 'broken.jpg'}" in err
    assert "embedding: 5 images in " in err


def test_verify_skip_bad_leaves_out_pairs_and_a_set_too_small_is_refused(workspace, tmp_path, capsys):
    """Test that verify names an undecodable image of a .bin (exit 2), and with --skip-bad
    leaves its pair out, counts it and scores the rest; and that a set with fewer pairs than
    10-fold verification needs is one line naming the count and the minimum, exit 2."""
    from sample_fc.data.bin_format import read_bin, write_bin
    from sample_fc.tools import verify
    from sample_fc.verification import MIN_PAIRS
    encoded, issame = read_bin(str(workspace["bin"]))
    damaged = list(encoded)
    damaged[3] = b"not an image"
    write_bin(str(tmp_path / "damaged.bin"), damaged, list(issame))
    argv = ["--model", str(workspace["models"]), "--bin", str(tmp_path / "damaged.bin")]
    with pytest.raises(SystemExit) as stop:
        verify.main(argv)
    error = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(error) == 1 and "damaged.bin: image 3" in error[0] and "--skip-bad" in error[0]
    assert verify.main(argv + ["--skip-bad"]) == 0
    captured = capsys.readouterr()
    assert "skipped 1 unreadable images" in captured.err and f"{len(issame) - 1} pairs kept" in captured.err
    images, kept = load_bin(str(workspace["bin"]), SIZE)
    keep = np.arange(len(issame)) != 1
    embedder = Embedder(workspace["symbol"], workspace["arg_params"], workspace["aux_params"], mx.cpu(), SIZE,
                        batch_size=TRAIN_BATCH)
    want = evaluate(embedder, images[np.repeat(keep, 2)], kept[keep]).line("damaged")
    assert want in captured.out.splitlines()
    assert "damaged: embedding: 38 images in " in captured.err
    write_bin(str(tmp_path / "small.bin"), list(encoded[:4]), list(issame[:2]))
    with pytest.raises(SystemExit) as stop:
        verify.main(["--model", str(workspace["models"]), "--bin", str(tmp_path / "small.bin")])
    error = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(error) == 1
    assert f"small.bin: 2 pairs; verification needs at least {MIN_PAIRS}" in error[0]


def test_make_bin_refuses_fewer_pairs_than_verify_needs(tmp_path):
    """Test that make_bin refuses, before writing, a list verify could not score: fewer than
    verification.MIN_PAIRS pairs (the 10 folds), or pairs of one kind only; the demo data
    refuses fewer pairs too."""
    from sample_fc.data.demo import make_demo
    from sample_fc.verification import MIN_PAIRS
    write_faces(str(tmp_path), 3)
    cases = {"".join(f"face00.png face02.png {i % 2}\n" for i in range(MIN_PAIRS - 1)):
             f"{MIN_PAIRS - 1} pairs; verification needs at least {MIN_PAIRS}",
             "face00.png face02.png 1\n" * MIN_PAIRS: "all 10 pairs are same-identity pairs"}
    for text, wanted in cases.items():
        (tmp_path / "pairs.txt").write_text(text)
        with pytest.raises(UsageError, match=wanted):
            make_bin.make_bin(str(tmp_path / "pairs.txt"), str(tmp_path / "x.bin"))
        assert not (tmp_path / "x.bin").exists()
    (tmp_path / "pairs.txt").write_text("".join(f"face00.png face02.png {i % 2}\n" for i in range(MIN_PAIRS)))
    assert make_bin.make_bin(str(tmp_path / "pairs.txt"), str(tmp_path / "x.bin")) == MIN_PAIRS
    with pytest.raises(UsageError, match=f"num_pairs must be an integer >= {MIN_PAIRS}, got 4"):
        make_demo(str(tmp_path / "demo"), num_pairs=4)


def test_a_damaged_model_names_the_file_and_offers_the_previous_checkpoint(workspace, tmp_path):
    """Test that a models root whose newest checkpoint has a damaged .params or symbol is one
    line naming that file and MXNet's reason, and offering the previous complete checkpoint
    as --model ROOT,STEP (as --resume would fall back to it); --pretrained names it too."""
    import shutil
    root = tmp_path / "models"
    for step in (100, 300):
        shutil.copytree(workspace["checkpoint"], root / f"step-{step:08d}")
    newest = root / "step-00000300"
    (root / "step-00000100" / f"model-{STEP:04d}.params").rename(root / "step-00000100" / "model-0100.params")
    params = newest / f"model-{STEP:04d}.params"
    intact = params.read_bytes()
    params.write_bytes(intact[:len(intact) // 2])
    with pytest.raises(UsageError) as raised:
        model_io.load_model(str(root))
    message = str(raised.value)
    assert "\n" not in message and f"{params} is damaged (" in message and "Invalid NDArray file format" in message
    assert message.endswith(f"the previous complete checkpoint is {root / 'step-00000100'}: --model {root},100")
    from sample_fc.models.saved_model import load_pretrained
    with pytest.raises(UsageError, match=f"--pretrained {root}: .*is damaged.*--pretrained {root},100"):
        load_pretrained(str(root), workspace["symbol"], SIZE, "mbf")
    params.write_bytes(intact)
    (newest / "model-symbol.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"model-symbol.json is damaged \(.*--model .*,100$"):
        model_io.load_model(str(root))
    assert model_io.load_model(f"{root},100").epoch == 100


def test_usage_mistakes_exit_2_in_every_tool_and_train(tmp_path, capsys):
    """Test that a mistake is exit code 2 with one line everywhere: each tool's UsageError (as
    argparse's own errors), and train.py's."""
    from sample_fc.tools import demo_data, ijb, pack, plan, verify
    cases = [(verify, ["--model", str(tmp_path / "nothing"), "--bin", str(tmp_path / "no.bin")]),
             (embed, ["--model", str(tmp_path / "nothing"), "--images", str(tmp_path), "--out", str(tmp_path / "e.npy")]),
             (make_bin, ["--pairs", str(tmp_path / "none.txt"), "--out", str(tmp_path / "x.bin")]),
             (pack, ["--images", str(tmp_path / "none"), "--out", str(tmp_path / "p" / "train")]),
             (demo_data, ["--out", str(tmp_path / "d"), "--num-pairs", "3"]),
             (ijb, ["--model", str(tmp_path / "nothing"), "--root", str(tmp_path / "none"), "--out", str(tmp_path / "i")]),
             (plan, ["-np", "0"])]
    for tool, argv in cases:
        with pytest.raises(SystemExit) as stop:
            tool.main(argv)
        error = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(error) == 1 and ": error: " in error[0], (tool.__name__, error)
    result = subprocess.run([sys.executable, "train.py", "--set", "no_such_key=1"], cwd=str(REPO),
                            capture_output=True, text=True, timeout=120, env=single_thread_env())
    assert result.returncode == 2 and "train.py: error: " in result.stderr, result.stderr[-2000:]


@pytest.mark.skipif(mx.context.num_gpus() > 0, reason="a CPU build's answer")
def test_gpu_context_on_a_cpu_build_is_one_line(workspace, tmp_path):
    """Test that --context gpu / gpu:0 on MXNet's CPU build ends a tool with one line naming
    the GPU and the way out, before any other work: exit 2, no MXNet traceback."""
    write_faces(str(tmp_path / "faces"), 1)
    for context in ("gpu", "gpu:0"):
        result = run_tool("sample_fc.tools.embed", "--model", workspace["models"], "--images", tmp_path / "faces",
                          "--out", tmp_path / "e.npy", "--context", context)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
        assert "--context gpu:0: MXNet sees 0 GPU(s) here; use --context cpu" in lines[0]
        assert not (tmp_path / "e.npy").exists()


@pytest.mark.parametrize("file, damage", [
    ("model-symbol.json", lambda data: b""),                                  # MXNet's message is not UTF-8
    ("model-symbol.json", lambda data: b"\x80\x02\x8a\x0a" + data[:100]),     # binary bytes
    (f"model-{STEP:04d}.params", lambda data: data[:-2] + b"\xff\xfe"),       # a name that is not UTF-8
    (f"model-{STEP:04d}.params", lambda data: data + b"\0" * 100),           # appended bytes
], ids=["empty-symbol", "binary-symbol", "name-bytes", "appended"])
def test_damage_mxnet_cannot_describe_is_one_line_in_load_model_and_pretrained(workspace, tmp_path, file, damage):
    """Test that a symbol or .params file damaged so that MXNet's own loader fails with bytes it
    cannot decode (or does not notice) is a UsageError naming the file, in --model and (the
    .params; --pretrained reads the symbol only to map other names) --pretrained, not a
    UnicodeDecodeError traceback or a silently accepted file."""
    import shutil
    from sample_fc.models.saved_model import load_pretrained
    checkpoint = tmp_path / "models" / f"step-{STEP:08d}"
    shutil.copytree(workspace["checkpoint"], checkpoint)
    path = checkpoint / file
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(UsageError, match=f"--model {checkpoint}: {path} is damaged \\("):
        model_io.load_model(str(checkpoint))
    if file.endswith(".params"):
        with pytest.raises(UsageError, match=f"--pretrained {checkpoint}: .*is damaged"):
            load_pretrained(str(checkpoint), workspace["symbol"], SIZE, "mbf")
    else:
        arg_params, _ = load_pretrained(str(checkpoint), workspace["symbol"], SIZE, "mbf")
        assert set(arg_params) == set(workspace["arg_params"])


@pytest.mark.parametrize("value, problem", [(np.inf, "1 non-finite values"), (-4.0022417e+36, "a value of magnitude 4e\\+36")],
                         ids=["inf", "huge"])
def test_a_model_with_a_nan_weight_is_one_line_in_the_tools_and_pretrained(workspace, tmp_path, value, problem):
    """Test that a .params one of whose values is infinite or 4e36 (a flip in an exponent's bits;
    MXNet loads it) is a UsageError naming the file and the parameter for --model and
    --pretrained, not NaN embeddings or a run that stops with non-finite losses."""
    import shutil
    from sample_fc.models.saved_model import load_pretrained
    checkpoint = tmp_path / f"step-{STEP:08d}"
    shutil.copytree(workspace["checkpoint"], checkpoint)
    params = {("arg:" + k): v for k, v in workspace["arg_params"].items()}
    params.update({("aux:" + k): v for k, v in workspace["aux_params"].items()})
    name = sorted(workspace["arg_params"])[0]
    damaged = params["arg:" + name].asnumpy().copy()
    damaged.flat[0] = value
    params["arg:" + name] = mx.nd.array(damaged)
    mx.nd.save(str(checkpoint / f"model-{STEP:04d}.params"), params)
    (checkpoint / "COMPLETE").unlink()             # a plain prefix: no checksums to refuse it first
    prefix = str(checkpoint / "model")
    with pytest.raises(UsageError, match=f"--model .*model-{STEP:04d}.params: {name} holds {problem}"):
        model_io.load_model(prefix)
    with pytest.raises(UsageError, match=f"--pretrained {prefix}: {name} holds {problem}"):
        load_pretrained(prefix, workspace["symbol"], SIZE, "mbf")
