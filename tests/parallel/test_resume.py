"""Test that --resume continues the run it names: its own config and models root, allowed
overrides only, damaged checkpoints skipped or named, nothing written before the checks."""
import json
import os
import subprocess
import sys

import numpy as np

from conftest import REPO, per_rank_tail, run_train, run_trains_together
from sample_fc.checkpoint import bank_shard_files, list_checkpoints
from bench.harness import run_job, single_thread_env
from test_train import assert_same, checkpoint_arrays

CUSTOM = ["--loss", "cosface", "--set", "loss_s=24", "--set", "loss_m3=0.3", "--set", "sample_ratio=0.5",
          "--set", "ckpt_period=4"]


def resume_only(*args, num_proc=2, cwd=None):
    """train.py --resume ... with nothing else from the original command line."""
    argv = [sys.executable, str(REPO / "train.py"), *map(str, args)]
    result = run_job(argv, num_proc=num_proc, timeout_s=300, cwd=str(cwd or REPO), env=single_thread_env())
    assert not result.timed_out, per_rank_tail(result.output)
    return result


def one_error_line(result):
    lines = [line for line in result.output.splitlines() if "train.py: error:" in line]
    assert result.returncode == 2 and len(lines) == 1, per_rank_tail(result.output)
    assert "Traceback" not in result.output and "Segmentation" not in result.output, result.output[-4000:]
    return lines[0]


def snapshot(root):
    return {path: path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def test_resume_takes_the_runs_config_and_root(tiny_data, tmp_path):
    """Test that `--resume ROOT --set max_update=8` alone continues a run trained with a custom
    loss and sampling (not the defaults) in ROOT, exactly as an uninterrupted run of 8 steps."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert run_train(straight, tiny_data, "--set", "max_update=8", *CUSTOM).returncode == 0
    assert run_train(interrupted, tiny_data, "--set", "max_update=4", *CUSTOM).returncode == 0
    result = resume_only("--resume", interrupted, "--set", "max_update=8")
    assert result.returncode == 0, per_rank_tail(result.output)
    config = json.loads((interrupted / "config.json").read_text())
    assert (config["loss"], config["loss_s"], config["loss_m3"], config["sample_ratio"]) == ("cosface", 24.0, 0.3, 0.5)
    assert config["max_update"] == 8 and config["num_classes"] == 16
    assert_same(checkpoint_arrays(str(interrupted / "step-00000008"), 2),
                checkpoint_arrays(str(straight / "step-00000008"), 2))


def test_curricularface_resumes_exactly_with_its_running_mean(tiny_data, tmp_path):
    """Test that a CurricularFace run stopped at step 4 and resumed continues exactly as an
    uninterrupted one (its running mean t, which every step changes, is in the checkpoint)."""
    loss = ["--loss", "curricularface", "--set", "loss_s=16", "--set", "ckpt_period=4"]
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert run_train(straight, tiny_data, "--set", "max_update=8", *loss).returncode == 0
    assert run_train(interrupted, tiny_data, "--set", "max_update=4", *loss).returncode == 0
    t = json.loads((interrupted / "step-00000004" / "rank1.json").read_text())["margin"]["t"]
    assert t != 0.0
    result = resume_only("--resume", interrupted, "--set", "max_update=8")
    assert result.returncode == 0, per_rank_tail(result.output)
    assert_same(checkpoint_arrays(str(interrupted / "step-00000008"), 2),
                checkpoint_arrays(str(straight / "step-00000008"), 2))


def test_changing_a_fixed_key_on_resume_is_refused(tiny_data, tmp_path):
    """Test that changing the model on resume (loss_s, --network) is one line naming the key and
    both values, exit 2, and the run's files stay byte-identical."""
    root = tmp_path / "run"
    assert run_train(root, tiny_data, "--set", "max_update=4", *CUSTOM).returncode == 0
    before = snapshot(root)
    line = one_error_line(resume_only("--resume", root, "--set", "loss_s=64"))
    assert "loss_s=64.0" in line and "loss_s=24.0" in line, line
    line = one_error_line(resume_only("--resume", root, "--network", "r18"))
    assert "network='r18'" in line and "network='mbf_small'" in line, line
    assert snapshot(root) == before


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tiny_data, tmp_path):
    """Test that with one byte flipped in rank 1's bank rows of the newest checkpoint (its
    checksum reached rank 0's COMPLETE from rank 1), resume says so in one warning, uses the
    previous complete checkpoint, and finishes the run; saving step 8 again moves the damaged
    directory aside (its bytes kept, one line) instead of deleting it."""
    root = tmp_path / "run"
    assert run_train(root, tiny_data, "--set", "max_update=8", *CUSTOM).returncode == 0
    weight = bank_shard_files(str(root / "step-00000008"), 1)["weight"]
    data = bytearray(open(weight, "rb").read())
    data[-5] ^= 0x01
    open(weight, "wb").write(data)
    result = resume_only("--resume", root, "--set", "max_update=10")
    assert result.returncode == 0, per_rank_tail(result.output)
    warnings = [line for line in result.output.splitlines() if "trying the previous complete checkpoint" in line]
    assert len(warnings) == 1 and "bank-rank1.weight.npy fails its xxh3_64 checksum" in warnings[0], result.output
    assert "at step 4" in result.output
    assert [s for s, _ in list_checkpoints(root)][-1] == 10
    moved = [line for line in result.output.splitlines() if "moved it to" in line]
    assert len(moved) == 1 and moved[0].endswith("step-00000008.damaged before saving this step"), result.output
    kept = bank_shard_files(str(root / "step-00000008.damaged"), 1)["weight"]
    assert open(kept, "rb").read() == bytes(data)


def test_damaged_checkpoint_named_directly_is_one_line(tiny_data, tmp_path):
    """Test that resuming a checkpoint whose backbone params were deleted (MXNet used to
    segfault) or truncated stops with one line naming the file, and writes nothing."""
    root = tmp_path / "run"
    assert run_train(root, tiny_data, "--set", "max_update=4", *CUSTOM).returncode == 0
    checkpoint = root / "step-00000004"
    params = checkpoint / "model-0004.params"
    data = params.read_bytes()
    params.write_bytes(data[: len(data) // 2])
    before = snapshot(root)
    assert f"model-0004.params is truncated ({len(data) // 2} bytes" in one_error_line(resume_only("--resume", checkpoint))
    os.remove(params)
    assert "model-0004.params is missing" in one_error_line(resume_only("--resume", checkpoint))
    assert snapshot(root) == {k: v for k, v in before.items() if k != params}


def test_resume_path_without_checkpoints_writes_nothing(tmp_path):
    """Test that a --resume path with no complete checkpoint is one line and creates nothing."""
    (tmp_path / "empty").mkdir()
    result = subprocess.run([sys.executable, str(REPO / "train.py"), "--resume", str(tmp_path / "empty")],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                            env=single_thread_env())
    assert result.returncode == 2 and "no complete checkpoint" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and sorted(os.listdir(tmp_path)) == ["empty"]
    assert not os.listdir(tmp_path / "empty")


def test_pretrained_loads_backbone_weights_only(tiny_data, tmp_path):
    """Test that --pretrained starts a new run from a trained backbone (after one step at a
    negligible lr its weights still equal the source's), with a fresh bank, and that a
    backbone that does not fit (another embedding size) is one line naming the layer."""
    import mxnet as mx
    from sample_fc.checkpoint.bank_shard import read_shard
    source = tmp_path / "source"
    assert run_train(source, tiny_data, "--set", "max_update=4").returncode == 0
    tuned = tmp_path / "tuned"
    result = run_train(tuned, tiny_data, "--set", "max_update=1", "--set", "lr=1e-9",
                       "--pretrained", source)
    assert result.returncode == 0, per_rank_tail(result.output)
    _, trained, _ = mx.model.load_checkpoint(str(source / "step-00000004" / "model"), 4)
    _, started, _ = mx.model.load_checkpoint(str(tuned / "step-00000001" / "model"), 1)
    assert sorted(trained) == sorted(started)
    for name in trained:
        if name.endswith("_gamma") and (started[name] == 1).asnumpy().all():
            continue     # BatchNorm(fix_gamma=True) overwrites its gamma with 1 in every forward
        assert abs(started[name] - trained[name]).max().asscalar() <= 1e-6, name
    bank_source = np.asarray(read_shard(bank_shard_files(str(source / "step-00000004"), 0))[1])
    bank_tuned = np.asarray(read_shard(bank_shard_files(str(tuned / "step-00000001"), 0))[1])
    assert abs(bank_source - bank_tuned).max() > 1e-3           # the class centers start fresh
    line = one_error_line(run_train(tmp_path / "bad", tiny_data, "--set", "embedding_size=64",
                                    "--pretrained", f"{source},4"))
    assert "--pretrained" in line and "embedding" in line and "64" in line, line
    assert not (tmp_path / "bad").exists()


def saved_as_old_mbf(root):
    """Make a run trained as mbf_small look as runs saved before the rename did: network 'mbf'
    in config.json and in every checkpoint's state.json, and no checksums in COMPLETE."""
    for path in [root / "config.json", *root.glob("step-*/state.json")]:
        data = json.loads(path.read_text())
        (data["config"] if "config" in data and "network" not in data else data)["network"] = "mbf"
        path.write_text(json.dumps(data))
    for path in root.glob("step-*/COMPLETE"):
        path.write_text(json.dumps({"step": json.loads(path.read_text())["step"]}))


def test_a_run_saved_as_the_old_mbf_resumes_as_mbf_small(tiny_data, tmp_path):
    """Test that a run saved when 'mbf' named the paper's network (stem 64 channels) resumes as
    'mbf_small', saying so in one line, and continues exactly as an uninterrupted run; and that
    the same run cannot be resumed as today's (wider) mbf."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    assert run_train(straight, tiny_data, "--set", "max_update=8", "--set", "ckpt_period=4").returncode == 0
    assert run_train(interrupted, tiny_data, "--set", "max_update=4", "--set", "ckpt_period=4").returncode == 0
    saved_as_old_mbf(interrupted)
    assert json.loads((interrupted / "step-00000004" / "state.json").read_text())["config"]["network"] == "mbf"
    line = one_error_line(resume_only("--resume", interrupted, "--network", "mbf", "--set", "max_update=8"))
    assert "network='mbf'" in line and "'mbf_small'" in line, line
    result = resume_only("--resume", interrupted, "--set", "max_update=8")
    assert result.returncode == 0, per_rank_tail(result.output)
    notes = [line for line in result.output.splitlines() if "now called 'mbf_small'" in line]
    assert len(notes) == 1 and "resuming it as 'mbf_small'" in notes[0], per_rank_tail(result.output)
    assert json.loads((interrupted / "config.json").read_text())["network"] == "mbf_small"
    assert_same(checkpoint_arrays(str(interrupted / "step-00000008"), 2),
                checkpoint_arrays(str(straight / "step-00000008"), 2))


def test_pretrained_from_an_original_naming_model(tiny_data, tmp_path):
    """Test that train.py --pretrained starts from a model in the original MXNet toolkit's
    naming (conv0, bn0, ..., pre_fc1, fc1) by matching its parameters by structure, says so in
    one line, and trains: after one step at a negligible lr the weights are the source's."""
    import mxnet as mx
    from original_models import save_original
    _, source_args, _ = save_original(str(tmp_path / "original"), (2, 2, 2, 2), 32, 32)
    tuned = tmp_path / "tuned"
    result = run_train(tuned, tiny_data, "--network", "r18", "--set", "max_update=1", "--set", "lr=1e-9",
                       "--pretrained", tmp_path / "original")
    assert result.returncode == 0, per_rank_tail(result.output)
    notes = [line for line in result.output.splitlines() if "matched by structure" in line]
    assert len(notes) == 1 and "conv0_weight -> stem_conv_weight" in notes[0], per_rank_tail(result.output)
    _, started, _ = mx.model.load_checkpoint(str(tuned / "step-00000001" / "model"), 1)
    pairs = {"stem_conv_weight": "conv0_weight", "stage3_unit1_shortcut_conv_weight": "stage3_unit1_conv1sc_weight",
             "embedding_fc_weight": "pre_fc1_weight", "stage4_unit2_prelu_gamma": "stage4_unit2_relu1_gamma"}
    for ours, theirs in pairs.items():
        np.testing.assert_allclose(started[ours].asnumpy().ravel(), source_args[theirs].asnumpy().ravel(),
                                   rtol=1e-5, atol=1e-6, err_msg=ours)


def test_resume_in_the_middle_of_the_sampling_warmup_is_exact(tiny_data, tmp_path):
    """Test that a run whose sample ratio warms up from 1.0 to 0.5 over 6 steps, with the
    sampled-softmax and weight-decay corrections (2 images per worker, so each worker's 8
    classes hold ~2 positives and the sample draws negatives: the corrections act), stopped
    at step 4 and resumed, ends at step 8 exactly as an uninterrupted run, and that the
    warm-up and each correction change the run (without any one of them, step 8 differs)."""
    small = ["--set", "batch_size=2", "--set", "sample_ratio=0.5", "--set", "ckpt_period=4",
             "--set", "sample_correction=true", "--set", "sample_wd_correction=true",
             "--set", "wd=0.05"]     # a decay large enough to see in 8 steps
    warm = small + ["--set", "sample_ratio_warmup_steps=6"]
    straight, interrupted, plain, uncorrected, undecayed = (
        tmp_path / name for name in ("straight", "interrupted", "plain", "uncorrected", "undecayed"))
    runs = {straight: ("--set", "max_update=8", *warm), interrupted: ("--set", "max_update=4", *warm),
            plain: ("--set", "max_update=8", *small),
            uncorrected: ("--set", "max_update=8", *warm, "--set", "sample_correction=false"),
            undecayed: ("--set", "max_update=8", *warm, "--set", "sample_wd_correction=false")}
    results = run_trains_together(tiny_data, runs)
    assert all(result.returncode == 0 for result in results.values()), \
        [per_rank_tail(result.output) for result in results.values() if result.returncode]
    result = resume_only("--resume", interrupted, "--set", "max_update=8")
    assert result.returncode == 0, per_rank_tail(result.output)
    saved = json.loads((interrupted / "config.json").read_text())
    assert saved["sample_ratio_warmup_steps"] == 6
    assert saved["sample_correction"] is True and saved["sample_wd_correction"] is True
    want = checkpoint_arrays(str(straight / "step-00000008"), 2)
    assert_same(checkpoint_arrays(str(interrupted / "step-00000008"), 2), want)
    for root in (plain, uncorrected, undecayed):
        other = checkpoint_arrays(str(root / "step-00000008"), 2)
        relative = np.abs(other["bank_weight"] - want["bank_weight"]) / np.abs(want["bank_weight"]).max()
        assert relative.max() > 1e-4, root.name
