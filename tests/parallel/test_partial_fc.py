"""Test that Partial FC on 2 Gloo workers equals 1 worker and the NumPy reference."""
import numpy as np
import pytest

from conftest import per_rank_tail
import partial_fc_case as case
import reference as ref

RTOL = 1e-5
LR = 0.05    # the worker's default --lr


def _args(prefix, **options):
    args = ["--out", prefix]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}"] + ([] if value is True else [value])
    return args


def _two_workers(horovod_job, prefix, **options):
    result = horovod_job("partial_fc_steps.py", *_args(prefix, **options))
    assert result.returncode == 0, per_rank_tail(result.output)
    return case.load_run(prefix, 2)


def test_two_workers_equal_one_worker_with_double_batch(horovod_job, single_process, tmp_path):
    """Test that at ratio 1.0, 2 workers with batch b equal 1 worker with batch 2b and NumPy."""
    options = dict(global_batch=8, classes=11, steps=3, ratio=1.0)
    two = _two_workers(horovod_job, tmp_path / "two", **options)
    single_process("partial_fc_steps.py", *_args(tmp_path / "one", **options))
    one = case.load_run(tmp_path / "one", 1)
    assert [len(r["bank_weight"]) for r in two["per_rank"]] == [6, 5]
    ref.assert_close(two["losses"], one["losses"], RTOL)
    for key in ("fc_embed_weight", "fc_embed_bias", "bank_weight", "bank_momentum"):
        ref.assert_close(two[key], one[key], RTOL, err_msg=key)
    weight, data, labels, centers = case.inputs(8, 11, 6, 3)
    losses, backbone, _, bank_w, _ = ref.partial_fc_run(data, labels, weight, centers, two["sampled"],
                                                        case.lr_of_step(LR), case.MARGINS)
    ref.assert_close(two["losses"], losses, RTOL)
    ref.assert_close(two["fc_embed_weight"], backbone, RTOL)
    ref.assert_close(two["bank_weight"], bank_w, RTOL)


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_curricularface_on_two_workers_equals_one_worker(horovod_job, single_process, tmp_path, kernel):
    """Test that CurricularFace, which reads every row's target cosine on every rank (one more
    allreduce) and keeps a running t, gives on 2 workers the losses, backbone and bank of 1
    worker with the double batch, for 3 steps on either kernel; and differs from ArcFace's run."""
    options = dict(global_batch=8, classes=11, steps=3, ratio=1.0, head_kernel=kernel)
    two = _two_workers(horovod_job, tmp_path / "two", margin="curricularface", **options)
    single_process("partial_fc_steps.py", *_args(tmp_path / "one", margin="curricularface", **options))
    one = case.load_run(tmp_path / "one", 1)
    ref.assert_close(two["losses"], one["losses"], RTOL)
    for key in ("fc_embed_weight", "bank_weight", "bank_momentum"):
        ref.assert_close(two[key], one[key], RTOL, err_msg=key)
    single_process("partial_fc_steps.py", *_args(tmp_path / "arc", **options))
    assert np.abs(np.asarray(case.load_run(tmp_path / "arc", 1)["losses"]) - np.asarray(one["losses"])).max() > 1e-3


def test_global_tail_makes_two_workers_equal_one_worker(horovod_job, single_process, tmp_path):
    """Test that with BatchNorms over samples in the backbone's last layers, tail_bn=global
    (global_tail.py) trains 2 workers x 4 as 1 worker x 8 (losses, weights, BatchNorm statistics,
    bank), while per-worker statistics (tail_bn=worker) do not: the split is what differs."""
    runs = {}
    for mode in ("global", "worker"):
        options = dict(global_batch=8, classes=11, steps=3, ratio=1.0, tail_bn=mode)
        runs[mode, 2] = _two_workers(horovod_job, tmp_path / f"two_{mode}", **options)
        single_process("partial_fc_steps.py", *_args(tmp_path / f"one_{mode}", **options))
        runs[mode, 1] = case.load_run(tmp_path / f"one_{mode}", 1)
    keys = ("fc_embed_weight", "hidden_bn_gamma", "fc_out_weight", "embeddings_beta", "hidden_bn_moving_mean", "hidden_bn_moving_var",
            "embeddings_moving_var", "bank_weight", "bank_momentum")
    one, two = runs["global", 1], runs["global", 2]
    ref.assert_close(two["losses"], one["losses"], RTOL)
    for key in keys:
        ref.assert_close(two[key], one[key], RTOL, err_msg=key)
    ref.assert_close(runs["worker", 1]["losses"], one["losses"], RTOL)   # one worker: the same network
    assert not np.allclose(runs["worker", 2]["losses"][1:], one["losses"][1:], rtol=1e-3)
    assert not np.allclose(runs["worker", 2]["hidden_bn_moving_var"], one["hidden_bn_moving_var"], rtol=1e-3)


def test_two_workers_sampled_softmax_matches_numpy(horovod_job, tmp_path):
    """Test that at ratio 0.1 on 2 workers the loss is the softmax over exactly the union of
    both ranks' sampled centers, rows never sampled are bit-identical afterwards, and each rank
    reports the global gradient norm of the whole batch (the reference's, not its half's)."""
    classes = 400
    run = _two_workers(horovod_job, tmp_path / "sampled", global_batch=8, classes=classes,
                       steps=2, ratio=0.1)
    weight, data, labels, centers = case.inputs(8, classes, 6, 2)
    for rank_run in run["per_rank"]:
        start, shard = int(rank_run["class_start"]), len(rank_run["bank_weight"])
        for step, sampled in enumerate(rank_run["sampled"]):
            positives = {int(y) for y in labels[step] if start <= y < start + shard}
            assert positives <= set(sampled) and len(sampled) == max(20, len(positives))
    grad_norms = []
    losses, backbone, _, bank_w, bank_m = ref.partial_fc_run(data, labels, weight, centers, run["sampled"],
                                                             case.lr_of_step(LR), case.MARGINS,
                                                             grad_norms=grad_norms)
    ref.assert_close(run["losses"], losses, RTOL)
    for rank_run in run["per_rank"]:
        ref.assert_close(rank_run["grad_norms"], grad_norms, RTOL)
    ref.assert_close(run["fc_embed_weight"], backbone, RTOL)
    ref.assert_close(run["bank_weight"], bank_w, RTOL)
    never = np.setdiff1d(np.arange(classes), np.concatenate(run["sampled"]))
    np.testing.assert_array_equal(run["bank_weight"][never], centers[never])


@pytest.mark.parametrize("kernel", ["host", "device"])
def test_sampled_softmax_corrections_on_two_workers_match_numpy(horovod_job, tmp_path, kernel):
    """Test that with the sampled-softmax correction each rank's sampled negatives enter the
    softmax with logit + log(F_r / n_r) (F_r: the rank's classes that are not positives of the
    batch, n_r: its negatives drawn), its positives unchanged, and with the weight-decay
    correction their bank rows decay with wd F_r / n_r, on both head kernels: losses, backbone
    and bank after 2 steps equal the NumPy reference given those offsets and scales, and differ
    from the reference without them."""
    classes = 400
    run = _two_workers(horovod_job, tmp_path / "corrected", global_batch=8, classes=classes, steps=2,
                       ratio=0.1, head_kernel=kernel, sample_correction=True, sample_wd_correction=True)
    weight, data, labels, centers = case.inputs(8, classes, 6, 2)
    offsets = []
    for step in range(2):
        columns = []
        for rank_run in run["per_rank"]:
            start, shard = int(rank_run["class_start"]), len(rank_run["bank_weight"])
            sampled = rank_run["sampled"][step]
            positives = {int(y) for y in labels[step] if start <= y < start + shard}
            negatives = len(sampled) - len(positives)
            columns += [(int(c), 0.0 if c in positives else np.log((shard - len(positives)) / negatives))
                        for c in sampled]
        offsets.append(np.array([offset for _, offset in sorted(columns)]))
    assert all(o.max() > 2.0 for o in offsets)       # about log(10): a real correction
    scales = [np.exp(o) for o in offsets]             # F_r / n_r on the negatives, 1 on the positives
    want = ref.partial_fc_run(data, labels, weight, centers, run["sampled"], case.lr_of_step(LR), case.MARGINS,
                              offsets=offsets, decay_scales=scales)
    ref.assert_close(run["losses"], want[0], RTOL)
    ref.assert_close(run["fc_embed_weight"], want[1], RTOL)
    ref.assert_close(run["bank_weight"], want[3], RTOL)
    ref.assert_close(run["bank_momentum"], want[4], RTOL)
    uncorrected = ref.partial_fc_run(data, labels, weight, centers, run["sampled"], case.lr_of_step(LR),
                                     case.MARGINS)
    assert np.all(np.abs(run["losses"] - uncorrected[0]) > 0.1)
    undecayed = ref.partial_fc_run(data, labels, weight, centers, run["sampled"], case.lr_of_step(LR),
                                   case.MARGINS, offsets=offsets)    # the logits corrected, the decay not
    with pytest.raises(AssertionError):               # the check above tells the two apart
        ref.assert_close(run["bank_weight"], undecayed[3], RTOL)


def test_allgather_strategies_agree(horovod_job, tmp_path):
    """Test that the native allgather and the zero-padded allreduce give the same training."""
    native = _two_workers(horovod_job, tmp_path / "native", steps=2, allgather="native")
    padded = _two_workers(horovod_job, tmp_path / "padded", steps=2, allgather="allreduce")
    np.testing.assert_array_equal(native["losses"], padded["losses"])
    np.testing.assert_array_equal(native["bank_weight"], padded["bank_weight"])
    np.testing.assert_array_equal(native["fc_embed_weight"], padded["fc_embed_weight"])


@pytest.mark.parametrize("where", ["data", "gradient"])
def test_nan_on_one_rank_skips_the_step_on_every_rank(horovod_job, tmp_path, where):
    """Test that a NaN in one rank's features (so its loss), or in one of its backbone gradients
    only (the loss and d loss / d embeddings finite), makes every rank skip that step: the
    result equals the NumPy reference trained on the other steps only."""
    run = _two_workers(horovod_job, tmp_path / "nan", steps=3, nan_step=1, nan_rank=1, nan_in=where)
    assert np.isnan(run["losses"][1]) and np.isfinite(run["losses"][[0, 2]]).all()
    weight, data, labels, centers = case.inputs(8, 11, 6, 3)
    kept = [0, 2]
    losses, backbone, bias, bank_w, bank_m = ref.partial_fc_run(
        data[kept], labels[kept], weight, centers, [run["sampled"][t] for t in kept],
        case.lr_of_step(LR), case.MARGINS)
    ref.assert_close(run["losses"][kept], losses, RTOL)
    ref.assert_close(run["fc_embed_weight"], backbone, RTOL)
    ref.assert_close(run["fc_embed_bias"], bias, RTOL)
    ref.assert_close(run["bank_weight"], bank_w, RTOL)
    ref.assert_close(run["bank_momentum"], bank_m, RTOL)


def test_consecutive_nonfinite_steps_stop_every_rank(horovod_job, tmp_path):
    """Test that reaching max_nonfinite_steps ends the job non-zero with a clear message."""
    result = horovod_job("partial_fc_steps.py", *_args(tmp_path / "stop", steps=2, nan_step=0,
                                                         nan_rank=0, max_nonfinite=1))
    assert result.returncode != 0
    assert "1 consecutive steps with non-finite loss or gradients" in result.output
    assert "STEPS_OK" not in result.stdout
