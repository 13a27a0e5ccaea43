"""Tests for SampleDistributeModule on one process against the NumPy reference."""
import numpy as np
import pytest

import partial_fc_case as case
import reference as ref

RTOL = 1e-5
LR = 0.05       # the worker's default --lr


def _run(single_process, tmp_path, name, **options):
    args = []
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", value]
    single_process("partial_fc_steps.py", "--out", tmp_path / name, *args)
    return case.load_run(tmp_path / name, 1)


def _reference(run, global_batch, classes, embedding, steps, lr, grad_norms=None):
    weight, data, labels, centers = case.inputs(global_batch, classes, embedding, steps)
    return ref.partial_fc_run(data, labels, weight, centers, run["sampled"], case.lr_of_step(lr),
                              case.MARGINS, grad_norms=grad_norms)


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_full_softmax_steps_match_numpy(single_process, tmp_path, kernel):
    """Test that 3 steps at ratio 1.0 give the NumPy reference's losses, backbone and bank,
    with either head kernel, and report the reference's backbone gradient norm (the progress
    line's `grad norm`)."""
    run = _run(single_process, tmp_path, "full", global_batch=8, classes=11, steps=3, ratio=1.0,
               head_kernel=kernel)
    assert all(len(s) == 11 for s in run["sampled"])
    grad_norms = []
    losses, weight, bias, bank_w, bank_m = _reference(run, 8, 11, 6, 3, LR, grad_norms)
    ref.assert_close(run["losses"], losses, RTOL)
    ref.assert_close(run["grad_norms"], grad_norms, RTOL)
    ref.assert_close(run["fc_embed_weight"], weight, RTOL)
    ref.assert_close(run["fc_embed_bias"], bias, RTOL)
    ref.assert_close(run["bank_weight"], bank_w, RTOL)
    ref.assert_close(run["bank_momentum"], bank_m, RTOL)
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_sampled_steps_match_numpy_and_leave_other_rows_untouched(single_process, tmp_path, kernel):
    """Test that at ratio 0.1 the loss is the softmax over exactly the sampled centers, sampled
    rows follow SGD-momentum and rows never sampled stay bit-identical (either head kernel)."""
    classes = 400
    run = _run(single_process, tmp_path, "sampled", global_batch=8, classes=classes, steps=2, ratio=0.1,
               head_kernel=kernel)
    _, _, labels, centers = case.inputs(8, classes, 6, 2)
    for step, sampled in enumerate(run["sampled"]):
        assert len(sampled) == 40 and set(labels[step]) <= set(sampled)
    losses, weight, _, bank_w, bank_m = _reference(run, 8, classes, 6, 2, LR)
    ref.assert_close(run["losses"], losses, RTOL)
    ref.assert_close(run["fc_embed_weight"], weight, RTOL)
    ref.assert_close(run["bank_weight"], bank_w, RTOL)
    ref.assert_close(run["bank_momentum"], bank_m, RTOL)
    never = np.setdiff1d(np.arange(classes), np.concatenate(run["sampled"]))
    assert len(never) > 300
    np.testing.assert_array_equal(run["bank_weight"][never], centers[never])
    assert not np.any(run["bank_momentum"][never])


def test_two_contexts_match_one(single_process, tmp_path):
    """Test that splitting the backbone over 2 contexts gives the same step as 1 context."""
    one = _run(single_process, tmp_path, "one", global_batch=8, classes=11, steps=2, contexts=1)
    two = _run(single_process, tmp_path, "two", global_batch=8, classes=11, steps=2, contexts=2)
    ref.assert_close(two["losses"], one["losses"], RTOL)
    for key in ("fc_embed_weight", "fc_embed_bias", "bank_weight", "bank_momentum"):
        ref.assert_close(two[key], one[key], RTOL)


def test_a_skipped_step_leaves_the_batchnorm_statistics_as_before(single_process, tmp_path):
    """Test that a step made non-finite by a NaN in its data (which the training forward carries
    into the BatchNorms' moving statistics) changes nothing: 3 steps with a NaN in step 1 end with
    the parameters and moving statistics of a run that never saw step 1's batch, bit for bit."""
    options = dict(global_batch=8, classes=11, steps=3, tail_bn="worker")
    skipped = _run(single_process, tmp_path, "skipped", nan_step=1, **options)
    dropped = _run(single_process, tmp_path, "dropped", drop_step=1, **options)
    assert np.isnan(skipped["losses"][1]) and np.isfinite(skipped["losses"][[0, 2]]).all()
    names = [key for key in dropped if key.endswith(("_moving_mean", "_moving_var", "_weight", "_gamma"))]
    assert {"hidden_bn_moving_mean", "embeddings_moving_var", "fc_out_weight", "bank_weight"} <= set(names)
    for key in names:
        np.testing.assert_array_equal(skipped[key], dropped[key], err_msg=key)
    assert not np.array_equal(dropped["hidden_bn_moving_mean"], 0)      # the statistics did move
