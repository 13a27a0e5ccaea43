"""Test train.py end to end on 2 Gloo workers: training, checkpoints, exact resume, reshard."""
import json
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from conftest import REPO, TINY_TRAIN, per_rank_tail, run_train, run_trains_together
from sample_fc.checkpoint import bank_shard_files, list_checkpoints, model_prefix
from sample_fc.run.run_root import read_progress, read_status
from bench.harness import single_thread_env
from sample_fc.checkpoint.bank_shard import read_shard_arrays

def train(models_root, rec, *extra, num_proc=2, timeout_s=300):
    result = run_train(models_root, rec, *extra, num_proc=num_proc, timeout_s=timeout_s)
    assert result.returncode == 0, result.output[-5000:]
    return result


def checkpoint_arrays(path, world):
    """Backbone params and the whole bank (shards concatenated in class order) of a checkpoint."""
    step = int(os.path.basename(path).split("-")[1])
    _, arg_params, aux_params = mx.model.load_checkpoint(model_prefix(path), step)
    arrays = {k: v.asnumpy() for k, v in {**arg_params, **aux_params}.items()}
    shards = sorted((read_shard_arrays(bank_shard_files(path, r)) for r in range(world)),
                    key=lambda shard: shard[0]["class_start"])
    for name in shards[0][1]:            # weight, momentum (int8: codes) and int8's momentum_scale
        arrays[f"bank_{name}"] = np.concatenate([np.asarray(s[1][name]) for s in shards])
    return arrays


def assert_same(a, b, rtol=1e-6):
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=1e-7, err_msg=key)


def test_two_workers_train_checkpoint_and_load(tiny_data, tmp_path):
    """Test that 2 workers train (loss falls), keep the last K checkpoints, write TensorBoard
    events, and the backbone loads with mx.model.load_checkpoint."""
    root = tmp_path / "run"
    result = train(root, tiny_data, "--set", "max_update=32", "--set", "ckpt_period=8",
                   "--set", "ckpt_keep=2", "--set", "verify_period=16", "--set", "tensorboard=true")
    progress = read_progress(str(root))
    assert [r["step"] for r in progress] == list(range(4, 33, 4)), per_rank_tail(result.stdout)
    losses = [r["loss"] for r in progress]
    assert np.mean(losses[-2:]) < np.mean(losses[:2]) - 1.0, losses
    assert [s for s, _ in list_checkpoints(root)] == [24, 32]
    symbol, arg_params, _ = mx.model.load_checkpoint(str(root / "step-00000032" / "model"), 32)
    assert symbol.list_outputs() == ["embeddings_output"] and "embedding_fc_weight" in arg_params
    assert list((root / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard events"
    config = json.loads((root / "config.json").read_text())
    assert config["max_update"] == 32 and config["network"] == "mbf_small"
    # the start-up log states the backbone's size and cost: the saved params' count (learnable)
    logged = re.search(r"backbone mbf_small at 32 px: ([\d.]+)M parameters, ([\d.]+) G multiply-adds", result.stdout)
    assert logged, per_rank_tail(result.stdout)
    assert float(logged.group(1)) == round(sum(v.size for v in arg_params.values()) / 1e6, 2)
    assert float(logged.group(2)) > 0
    # in-training verification ran on both workers (steps 16 and 32) and the stand-alone tool
    # reproduces the number of the final model exactly
    trained = re.findall(r"step (16|32)  (demo_val: accuracy .*)", result.stdout)
    assert [step for step, _ in trained] == ["16", "32"], per_rank_tail(result.stdout)
    status = read_status(str(root))
    assert (status["state"], status["step"], status["verification"]["step"]) == ("done", 32, 32), status
    assert f"accuracy {status['verification']['accuracy']['demo_val']:.4f}" in trained[-1][1]
    bin_path = os.path.join(os.path.dirname(tiny_data), "demo_val.bin")
    verify = subprocess.run([sys.executable, "-m", "sample_fc.tools.verify", "--model", str(root),
                             "--bin", bin_path], capture_output=True, text=True, timeout=120,
                            cwd=str(REPO), env=single_thread_env())
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert trained[-1][1].strip() in verify.stdout, (trained[-1][1], verify.stdout)
    # MXNet's notice at every graph it binds (each worker, each verification, each tool) is off
    assert "Subgraph backend" not in result.output + verify.stderr
    # the end record holds every worker's peak memory, logged beside the plan's total
    end = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()][-1]
    start = [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()][0]
    assert end["event"] == "end" and len(end["peak_rss_bytes"]) == 2 and min(end["peak_rss_bytes"]) > 100e6, end
    assert end["planned_bytes"] == sum(start["memory_plan"][key] for key in ("bank", "sampler", "head", "backbone",
                                                                             "data", "runtime"))
    assert (f"memory: peak {max(end['peak_rss_bytes']) / 1e9:.2f} GB resident in the largest of 2 worker(s); "
            f"the memory plan said {end['planned_bytes'] / 1e9:.2f} GB per worker") in result.stdout


@pytest.mark.parametrize("bank_dtype,bank_momentum", [("float32", "same"), ("float16", "same"), ("float16", "int8")])
def test_exact_resume_equals_uninterrupted(tiny_data, tmp_path, bank_dtype, bank_momentum):
    """Test that k steps + resume + k steps equal 2k uninterrupted steps (backbone, optimizer
    effect, bank weights and momentum), with sampling at ratio 0.5 and data reshuffling; a
    float16 bank too (its stochastic rounding is a function of the update, not of the run), and
    with an int8 momentum (codes and scales)."""
    common = ["--set", "sample_ratio=0.5", "--set", "ckpt_period=6", "--set", f"bank_dtype={bank_dtype}",
              "--set", f"bank_momentum={bank_momentum}"]
    train(tmp_path / "straight", tiny_data, "--set", "max_update=12", *common)
    train(tmp_path / "resumed", tiny_data, "--set", "max_update=12", *common,
          "--resume", tmp_path / "straight" / "step-00000006")
    resumed = checkpoint_arrays(str(tmp_path / "resumed" / "step-00000012"), 2)
    assert resumed["bank_weight"].dtype == np.dtype(bank_dtype)
    assert resumed["bank_momentum"].dtype == np.dtype(np.int8 if bank_momentum == "int8" else bank_dtype)
    assert ("bank_momentum_scale" in resumed) == (bank_momentum == "int8")
    assert_same(resumed, checkpoint_arrays(str(tmp_path / "straight" / "step-00000012"), 2))


def test_vit_on_adamw_resumes_exactly_with_its_moments_and_drop_path(tiny_data, tmp_path):
    """Test that vit_t on its recipe (AdamW, the bank on SGD at its own lr) trains on 2 workers
    and that 4 steps + resume + 4 steps equal 8 uninterrupted ones: AdamW's two moments per
    parameter are in the checkpoint, its bias corrections count from the run's step, and drop
    path (random per step) draws the same masks after the resume."""
    common = ["--network", "vit_t", "--set", "lr=0.001", "--set", "bank_lr=2.0", "--set", "warmup_steps=2",
              "--set", "ckpt_period=4"]
    straight = train(tmp_path / "straight", tiny_data, "--set", "max_update=8", *common)
    assert re.search(r"step 4/8 .* lr 0\.000\d+ \(bank 0\.\d+\)", straight.stdout), straight.stdout[-2000:]
    train(tmp_path / "resumed", tiny_data, "--set", "max_update=8", *common,
          "--resume", tmp_path / "straight" / "step-00000004")
    saved = mx.nd.load(str(tmp_path / "straight" / "step-00000004" / "optimizer.params"))
    assert saved and all(key.endswith(".2") for key in saved)          # (mean, var) per parameter
    config = json.loads((tmp_path / "straight" / "config.json").read_text())
    assert (config["optimizer"], config["decay_all"], config["bank_lr"]) == ("adamw", True, 2.0)
    after = checkpoint_arrays(str(tmp_path / "straight" / "step-00000008"), 2)
    before = checkpoint_arrays(str(tmp_path / "straight" / "step-00000004"), 2)
    assert np.abs(after["block0_attn_qkv_weight"] - before["block0_attn_qkv_weight"]).max() > 0
    assert_same(checkpoint_arrays(str(tmp_path / "resumed" / "step-00000008"), 2), after)


def test_reshard_two_to_one_and_back(tiny_data, tmp_path):
    """Test that a 2-worker checkpoint resumes on 1 worker and back with every center and
    momentum row in place (no training in between, so the arrays must be unchanged)."""
    train(tmp_path / "two", tiny_data, "--set", "max_update=4")
    source = checkpoint_arrays(str(tmp_path / "two" / "step-00000004"), 2)
    train(tmp_path / "one", tiny_data, "--set", "max_update=4", "--resume", tmp_path / "two", num_proc=1)
    assert_same(checkpoint_arrays(str(tmp_path / "one" / "step-00000004"), 1), source, rtol=0)
    train(tmp_path / "back", tiny_data, "--set", "max_update=4", "--resume", tmp_path / "one")
    assert_same(checkpoint_arrays(str(tmp_path / "back" / "step-00000004"), 2), source, rtol=0)


def test_bad_set_key_is_named(tmp_path):
    """Test that an unknown --set key fails before training with a message naming it."""
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--set", "lrr=0.1",
                             "--models-root", str(tmp_path)], capture_output=True, text=True,
                            timeout=120, cwd=str(REPO), env=single_thread_env())
    assert result.returncode == 2
    assert "unknown config key 'lrr'" in result.stderr and "'lr'" in result.stderr


def test_dataset_property_sets_classes_and_image_size(tmp_path):
    """Test that a dataset's property file decides num_classes and image_size when the command
    line does not (a 48 px, 6-identity set is not trained as the demo's 32 px, 200 classes),
    said once, and that an explicit --set image_size wins, said once too."""
    from bench.harness import run_job
    from sample_fc.tools.demo_data import make_demo
    make_demo(str(tmp_path / "set"), num_identities=6, images_per_identity=8, num_val_identities=4,
              num_pairs=10, image_size=48, progress=False)
    base = [sys.executable, str(REPO / "train.py"), "--set", f"rec={tmp_path / 'set' / 'train.rec'}",
            "--set", "max_update=2", "--set", "batch_size=4", "--set", "embedding_size=16"]
    result = run_job(base + ["--models-root", str(tmp_path / "auto")], num_proc=2, timeout_s=300,
                     cwd=str(tmp_path), env=single_thread_env())
    assert result.returncode == 0, per_rank_tail(result.output)
    config = json.loads((tmp_path / "auto" / "config.json").read_text())
    assert (config["num_classes"], config["image_size"]) == (6, 48)
    assert result.output.count("image_size=48 from the dataset's property file") == 1
    assert result.output.count("trains with the demo's recipe, tuned for its 200 synthetic identities") == 1
    result = run_job(base + ["--models-root", str(tmp_path / "explicit"), "--set", "image_size=32"],
                     num_proc=2, timeout_s=300, cwd=str(tmp_path), env=single_thread_env())
    assert result.returncode == 0, per_rank_tail(result.output)
    assert json.loads((tmp_path / "explicit" / "config.json").read_text())["image_size"] == 32
    assert result.output.count("images are 48x48 px and train at image_size=32") == 1


def test_custom_preset_trains_your_set_from_its_property_file(tmp_path):
    """Test that --dataset custom takes the set's class count and image size from its property
    file, resolves sample_ratio=auto to a number saved in config.json (the smallest ratio whose
    q*K/B reaches 35: 6 classes, global batch 8 -> 1.0), trains at the preset's lr, and that
    without --set rec it stops in one line, exit 2, naming what to set."""
    from bench.harness import run_job
    from sample_fc.tools.demo_data import make_demo
    make_demo(str(tmp_path / "set"), num_identities=6, images_per_identity=8, num_val_identities=4,
              num_pairs=10, image_size=48, progress=False)
    base = [sys.executable, str(REPO / "train.py"), "--dataset", "custom"]
    missing = subprocess.run(base + ["--models-root", str(tmp_path / "none")], capture_output=True, text=True,
                             timeout=120, cwd=str(tmp_path), env=single_thread_env())
    assert missing.returncode == 2 and not (tmp_path / "none").exists()
    assert "dataset custom trains your own set: --set rec=DIR/train.rec" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    result = run_job(base + ["--set", f"rec={tmp_path / 'set' / 'train.rec'}", "--set", "max_update=2",
                             "--set", "batch_size=4", "--set", "embedding_size=16",
                             "--models-root", str(tmp_path / "run")],
                     num_proc=2, timeout_s=300, cwd=str(tmp_path), env=single_thread_env())
    assert result.returncode == 0, per_rank_tail(result.output)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["dataset"], config["num_classes"], config["image_size"]) == ("custom", 6, 48)
    assert config["sample_ratio"] == 1.0 and config["lr"] == 0.1
    assert "demo's recipe" not in result.output


def test_custom_preset_trains_at_a_ratio_chosen_by_hand(tmp_path):
    """Test that --dataset custom takes a sample ratio by hand (its preset holds the word auto,
    and `--set sample_ratio=0.5` once ended in a TypeError traceback): 0.5 and 0.1 train, are
    saved in config.json as numbers, and 0.1 says once that the regime has cost accuracy."""
    from bench.harness import run_job
    from sample_fc.tools.demo_data import make_demo
    make_demo(str(tmp_path / "set"), num_identities=40, images_per_identity=2, num_val_identities=4,
              num_pairs=10, image_size=32, progress=False)
    for ratio in ("0.5", "0.1"):
        root = tmp_path / f"run{ratio}"
        result = run_job([sys.executable, str(REPO / "train.py"), "--dataset", "custom",
                          "--set", f"rec={tmp_path / 'set' / 'train.rec'}", "--set", f"sample_ratio={ratio}",
                          "--set", "max_update=2", "--set", "batch_size=4", "--set", "embedding_size=16",
                          "--models-root", str(root)],
                         num_proc=2, timeout_s=300, cwd=str(tmp_path), env=single_thread_env())
        assert result.returncode == 0, per_rank_tail(result.output)
        assert "Traceback" not in result.output
        assert json.loads((root / "config.json").read_text())["sample_ratio"] == float(ratio)
        assert result.output.count(f"sample_ratio={ratio} is where sampling has cost accuracy") == 1


def test_not_learning_is_said_in_a_real_run(tiny_data, tmp_path):
    """Test the not-learning watch on real training: at an absurd lr (200) the tiny set's loss
    sits at or above chance with a small gradient and the warning is logged once and kept in
    status.json; at the tiny settings' own lr the run learns and nothing is said; with
    not_learning_steps=0 the stuck run says nothing. The watch looks at 40 steps here
    (not_learning_steps; 200 by default)."""
    common = ("--set", "max_update=60", "--set", "frequent=20", "--set", "not_learning_steps=40")
    runs = run_trains_together(tiny_data, {tmp_path / "stuck": ("--set", "lr=200", *common),
                                           tmp_path / "learning": common,
                                           tmp_path / "unwatched": ("--set", "lr=200", *common,
                                                                    "--set", "not_learning_steps=0")})
    for result in runs.values():
        assert result.returncode == 0, result.output[-5000:]
    stuck = runs[tmp_path / "stuck"].output
    assert stuck.count("not learning: the loss has sat at") == 1, per_rank_tail(stuck)
    assert "for the 40 steps up to step 40" in stuck, per_rank_tail(stuck)
    assert read_status(str(tmp_path / "stuck"))["warning"].startswith("not learning: the loss has sat at")
    for quiet in ("learning", "unwatched"):
        assert "not learning" not in runs[tmp_path / quiet].output
        assert read_status(str(tmp_path / quiet)).get("warning") is None


def test_the_centers_optimizer_follows_the_visit_gap(tmp_path):
    """Test that bank_momentum=auto gives the centers no momentum when a class comes back every
    10 steps or later (40 classes, a global batch of 4) and keeps it sooner (a global batch of 8):
    config.json holds the choice, the checkpoint's shards store a momentum only for the second,
    and the start-up log says once what the centers got and why."""
    from bench.harness import run_job
    from sample_fc.tools.demo_data import make_demo
    make_demo(str(tmp_path / "set"), num_identities=40, images_per_identity=2, num_val_identities=4,
              num_pairs=10, image_size=32, progress=False)
    for batch, chosen, gap in ((2, "none", "10.0"), (4, "same", "5.0")):
        root = tmp_path / f"batch{batch}"
        result = run_job([sys.executable, str(REPO / "train.py"), "--dataset", "custom",
                          "--set", f"rec={tmp_path / 'set' / 'train.rec'}", "--set", "bank_momentum=auto",
                          "--set", "max_update=2", "--set", f"batch_size={batch}", "--set", "embedding_size=16",
                          "--set", "ckpt_period=2", "--models-root", str(root)],
                         num_proc=2, timeout_s=300, cwd=str(tmp_path), env=single_thread_env())
        assert result.returncode == 0, per_rank_tail(result.output)
        assert json.loads((root / "config.json").read_text())["bank_momentum"] == chosen
        said = re.findall(r"class centers: (.*)", result.output)
        assert len(said) == 1 and f"a class comes back every {gap} steps (C/B)" in said[0], said
        assert said[0].startswith("plain SGD" if chosen == "none" else "SGD with momentum 0.9"), said
        path = list_checkpoints(root)[-1][1]
        names = {name for r in range(2) for name in read_shard_arrays(bank_shard_files(path, r))[1]}
        assert ("momentum" in names) == (chosen == "same"), names


def test_an_experiment_file_trains_as_its_set_lines_would(tiny_data, tmp_path):
    """Test that `train.py --config FILE` under horovodrun trains from a 3-line file with the
    config `--set` gives for the same lines (config.json against --print-config), keeps the file
    in the models root and shows it in the report, and that a wrong key in it ends train.py in
    one line naming the file and line, before anything is written."""
    lines = ["max_update = 4", "ckpt_period = 4   # one checkpoint", "bank_momentum = none"]
    experiment = tmp_path / "exp.cfg"
    experiment.write_text("\n".join(lines) + "\n")
    root = tmp_path / "run"
    train(root, tiny_data, "--config", experiment)
    as_set = [word for line in lines for word in ("--set", line.split("#")[0].replace(" ", ""))]
    printed = subprocess.run([sys.executable, str(REPO / "train.py"), "--set", f"rec={tiny_data}", *TINY_TRAIN,
                              *as_set, "--print-config"], capture_output=True, text=True, timeout=120,
                             cwd=str(REPO), env=single_thread_env())
    assert printed.returncode == 0, printed.stderr
    saved = json.loads((root / "config.json").read_text())
    saved.pop("run_id")
    assert saved == json.loads(printed.stdout) and saved["bank_momentum"] == "none"
    assert list_checkpoints(root)[-1][0] == 4
    kept = (root / "experiment.cfg").read_text()
    assert kept == f"# from --config {experiment}\n" + experiment.read_text()
    report = subprocess.run([sys.executable, "-m", "sample_fc.tools.report", str(root), "--out", str(tmp_path / "rep")],
                            capture_output=True, text=True, timeout=300, cwd=str(REPO), env=single_thread_env())
    assert report.returncode == 0, report.stderr
    assert "ckpt_period = 4   # one checkpoint" in (tmp_path / "rep" / "report.html").read_text()
    experiment.write_text("max_update = 4\nlr_stepz = [2]\n")
    bad = subprocess.run([sys.executable, str(REPO / "train.py"), "--config", str(experiment), "--models-root",
                          str(tmp_path / "bad")], capture_output=True, text=True, timeout=120, cwd=str(REPO),
                         env=single_thread_env())
    assert bad.returncode == 2 and not (tmp_path / "bad").exists()
    assert bad.stderr.strip().splitlines()[-1].startswith(
        f"train.py: error: --config {experiment}, line 2: unknown config key 'lr_stepz'; did you mean 'lr_steps'?")
