"""The world-size oracle: N workers train what one worker trains on the same global batch.

With BatchNorm statistics independent of the split (bn_frozen: every BatchNorm normalises by
its moving statistics) and every class scored (sample_ratio 1), a step is a function of the
global batch only: 1 x 16, 2 x 8 and 4 x 4 workers from the same initial state must give the
same loss at every step and the same backbone and bank after it, to float32 rounding. The one
worker run is the reference. Three steps: a few more at this size let one activation of one
channel cross a ReLU's kink by a rounding difference (seen at step 4 with lr 2.0: one depthwise
channel 2e-4 apart, every other one 1e-7), which is rounding made visible, not a split.
"""
import numpy as np

from conftest import per_rank_tail, run_train
from sample_fc.run.run_root import read_progress
from test_train import checkpoint_arrays

GLOBAL_BATCH, STEPS = 16, 3
EXACT = ["--set", "sample_ratio=1.0", "--set", "frequent=1", "--set", "lr=1.0", "--set", f"max_update={STEPS}",
         "--set", f"ckpt_period={STEPS}", "--set", "tensorboard=false"]


def trained(root, rec, world, *extra):
    result = run_train(root, rec, "--set", f"batch_size={GLOBAL_BATCH // world}", *EXACT, *extra, num_proc=world)
    assert result.returncode == 0, per_rank_tail(result.output)
    return result


def test_one_two_and_four_workers_train_the_same_steps(tiny_data, tmp_path):
    """Test that from one trained backbone (--pretrained; fresh centers, which are split-independent)
    with bn_frozen, 2 x 8 and 4 x 4 workers give one worker x 16's loss at each of 3 steps and its
    backbone, bank and bank momentum after them, within 1e-5 relative (L2 of each array)."""
    warm = tmp_path / "warm"           # BatchNorm statistics of a trained network, not 0 and 1
    trained(warm, tiny_data, 1, "--set", "max_update=12", "--set", "ckpt_period=12")
    runs = {}
    for world in (1, 2, 4):
        root = tmp_path / f"world{world}"
        trained(root, tiny_data, world, "--set", "bn_frozen=true", "--pretrained", warm)
        losses = [record["loss"] for record in read_progress(str(root))]
        runs[world] = losses, checkpoint_arrays(str(root / f"step-{STEPS:08d}"), world)
    reference_losses, reference = runs[1]
    assert len(reference_losses) == STEPS and len(set(reference_losses)) == STEPS
    for world in (2, 4):
        losses, arrays = runs[world]
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-5, err_msg=f"{world} workers' losses")
        assert sorted(arrays) == sorted(reference)
        for name, expected in reference.items():
            error = relative_error(arrays[name], expected)
            assert error <= 1e-5, f"{world} workers: {name} {error:.2e} from one worker's"
    pretrained = checkpoint_arrays(str(warm / "step-00000012"), 1)
    moved = [name for name in pretrained if name.endswith("_weight") and not name.startswith("bank")
             and not np.array_equal(pretrained[name], reference[name])]
    assert moved, "the oracle's steps changed no weight"
    for name in pretrained:
        if "moving" in name:            # frozen: the statistics the steps normalised by are kept
            np.testing.assert_array_equal(reference[name], pretrained[name], err_msg=name)


def relative_error(actual, expected):
    return np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-12)


def test_global_tail_starts_as_one_network_and_resumes_exactly(tiny_data, tmp_path):
    """Test that tail_bn=global on one worker trains the steps tail_bn=worker does (the same initial
    weights drawn, the same math in two parts: the losses of 2 steps and every weight after the
    first within 1e-5; the second step's weights are not compared: with live BatchNorms from
    scratch at lr 1, one worker's own runs at 1 and 2 threads end it 2.5e-4 apart), and on 2
    workers a run stopped at step 2 and resumed ends at step 4 where an uninterrupted one does
    (the tail's weights, BatchNorm statistics and optimizer state included)."""
    from test_resume import resume_only
    from test_train import assert_same
    two_steps = ["--set", "max_update=2", "--set", "ckpt_period=1"]
    for mode in ("worker", "global"):
        trained(tmp_path / f"one_{mode}", tiny_data, 1, *two_steps, "--set", f"tail_bn={mode}")
    one = {mode: read_progress(str(tmp_path / f"one_{mode}")) for mode in ("worker", "global")}
    np.testing.assert_allclose([r["loss"] for r in one["global"]], [r["loss"] for r in one["worker"]], rtol=1e-6)
    arrays = {mode: checkpoint_arrays(str(tmp_path / f"one_{mode}" / "step-00000001"), 1) for mode in one}
    weights = [name for name in arrays["worker"] if name.endswith("_weight") or name.endswith("_gamma")]
    assert "embedding_fc_weight" in weights and "gdc_bn_gamma" in weights and "bank_weight" in weights
    for name in weights:
        assert relative_error(arrays["global"][name], arrays["worker"][name]) <= 1e-5, name
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    global_tail = ["--set", "tail_bn=global", "--set", f"batch_size={GLOBAL_BATCH // 2}"]
    assert run_train(straight, tiny_data, *global_tail, "--set", "max_update=4").returncode == 0
    assert run_train(stopped, tiny_data, *global_tail, "--set", "max_update=2").returncode == 0
    result = resume_only("--resume", stopped, "--set", "max_update=4")
    assert result.returncode == 0, per_rank_tail(result.output)
    assert_same(checkpoint_arrays(str(stopped / "step-00000004"), 2),
                checkpoint_arrays(str(straight / "step-00000004"), 2))
