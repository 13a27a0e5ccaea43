"""Tests for sample_fc.optimizers: the lr schedule, the bank's SGD, the distributed wrapper."""
import mxnet as mx
import numpy as np
import pytest

import reference as ref
from sample_fc import dist
from sample_fc.optimizers import AdamW, BackboneOptimizer, WarmupMultiStepSchedule, WarmupPolySchedule
from sample_fc.pfc.bank_optimizer import MemoryBankSGDOptimizer


@pytest.fixture(scope="module", autouse=True)
def horovod():
    """Horovod in this process (world size 1, no horovodrun): the wrapper's allreduce runs."""
    dist.init()
    assert dist.size() == 1


def schedule_by_hand(n):
    """base 0.4, warm-up 4 updates, steps [6, 9], factor 0.1, written out case by case."""
    ramp = n / 4 if n < 4 else 1.0
    decay = 1.0 if n < 6 else 0.1 if n < 9 else 0.01
    return 0.4 * ramp * decay


def test_schedule_matches_the_formula_at_the_warmup_and_every_boundary():
    """Test that lr(n) ramps linearly over the warm-up, then drops by the factor exactly at each
    step (n = step is already decayed), for every n around the boundaries."""
    schedule = WarmupMultiStepSchedule(0.4, warmup_steps=4, steps=[6, 9], factor=0.1)
    for n in range(0, 13):
        assert schedule(n) == pytest.approx(schedule_by_hand(n), rel=1e-12, abs=0.0), n
    assert schedule(0) == 0.0 and schedule(2) == pytest.approx(0.2)
    assert schedule(5) == pytest.approx(0.4) and schedule(6) == pytest.approx(0.04)
    assert schedule(8) == pytest.approx(0.04) and schedule(9) == pytest.approx(0.004)
    assert WarmupMultiStepSchedule(0.3)(10**6) == 0.3          # no warm-up, no steps


def test_schedule_is_a_pure_function_of_the_update_number():
    """Test that calling the schedule out of order (as a resumed run does) gives the same values
    as calling it in order; MXNet's own MultiFactorScheduler would not."""
    updates = list(range(1, 15))
    in_order = [WarmupMultiStepSchedule(1.0, 3, [5, 10], 0.5)(n) for n in updates]
    schedule = WarmupMultiStepSchedule(1.0, 3, [5, 10], 0.5)
    shuffled = np.random.default_rng(0).permutation(updates)
    out_of_order = {int(n): schedule(int(n)) for n in shuffled}
    assert [out_of_order[n] for n in updates] == in_order
    assert [schedule(n) for n in reversed(updates)] == in_order[::-1]
    assert schedule(7) == schedule(7) == 0.5


@pytest.mark.parametrize("steps", [[0, 5], [-3], [5, 5], [8, 4], [2, 6, 6]])
def test_schedule_rejects_bad_steps_naming_them(steps):
    """Test that non-positive or non-increasing steps are refused with the steps in the message."""
    with pytest.raises(ValueError, match=f"increasing, got {steps}".replace("[", r"\[").replace("]", r"\]")):
        WarmupMultiStepSchedule(0.1, steps=steps)


def test_schedule_rejects_negative_warmup_naming_it():
    """Test that a negative warm-up is refused with the value in the message."""
    with pytest.raises(ValueError, match="warmup_steps must be >= 0, got -2"):
        WarmupMultiStepSchedule(0.1, warmup_steps=-2)


def _bank_rows(seed, rows=5, dim=4):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, dim)), rng.standard_normal((rows, dim)) * 0.1,
            rng.standard_normal((rows, dim)) * 3.0)


@pytest.mark.parametrize("kind", ["ndarray", "numpy"])
@pytest.mark.parametrize("scaled", [False, True])
def test_bank_update_matches_numpy_in_place(kind, scaled):
    """Test that MemoryBankSGDOptimizer.update rewrites the given weight and momentum rows in
    place (NDArrays for the device kernel, NumPy arrays as the host kernel's rows) exactly as
    MXNet's sgd_mom_update form of SGD-momentum with weight decay (reference.sgd_momentum),
    with the lr of the schedule at num_update, over two successive updates; with decay scales
    (the weight-decay correction) each row's wd is wd times its scale."""
    schedule = WarmupMultiStepSchedule(0.2, warmup_steps=0, steps=[2], factor=0.1)
    opt = MemoryBankSGDOptimizer(schedule, momentum=0.9, wd=5e-3)
    weight, mom, grad = _bank_rows(1)
    array = mx.nd.array if kind == "ndarray" else (lambda a: a.astype(np.float32))
    weight_rows, mom_rows = array(weight), array(mom)
    scales = np.array([1.0, 12.5, 1.0, 3.0, 40.0], dtype=np.float32) if scaled else None
    wd = 5e-3 * scales[:, None] if scaled else 5e-3
    expected_w, expected_m = weight, mom
    for num_update, lr in ((1, 0.2), (2, 0.02)):
        opt.update(weight_rows, mom_rows, array(grad), num_update, scales)
        expected_w, expected_m = ref.sgd_momentum(expected_w, grad, expected_m, lr, 0.9, wd)
        as_numpy = (lambda a: a.asnumpy()) if kind == "ndarray" else np.asarray
        ref.assert_close(as_numpy(weight_rows), expected_w, 1e-6)
        ref.assert_close(as_numpy(mom_rows), expected_m, 1e-6)


def test_bank_update_in_pytorch_form_matches_torch_sgd_across_an_lr_drop():
    """Test that the "pytorch" form keeps -buf of torch.optim.SGD (buf = m buf + g + wd w,
    w -= lr buf; NumPy) over an lr drop, where it differs from the "mxnet" form: the step right
    after the drop is lr_new * buf, not the old lr-scaled momentum plus lr_new * g."""
    schedule = WarmupMultiStepSchedule(0.2, warmup_steps=0, steps=[3], factor=0.1)
    opt = MemoryBankSGDOptimizer(schedule, momentum=0.9, wd=5e-3, momentum_form="pytorch")
    weight, mom, grad = _bank_rows(4)
    weight_nd, mom_nd = mx.nd.array(weight), mx.nd.array(mom)
    expected_w, expected_m, mxnet_w, mxnet_m = weight, mom, weight, mom
    for num_update, lr in ((1, 0.2), (2, 0.2), (3, 0.02)):
        opt.update(weight_nd, mom_nd, mx.nd.array(grad * num_update), num_update)
        expected_w, expected_m = ref.sgd_momentum_pytorch(expected_w, grad * num_update, expected_m, lr, 0.9, 5e-3)
        ref.assert_close(weight_nd.asnumpy(), expected_w, 1e-5)
        ref.assert_close(mom_nd.asnumpy(), expected_m, 1e-5)
    for num_update, lr in ((1, 0.2), (2, 0.2), (3, 0.02)):    # the mxnet form from the same start
        mxnet_w, mxnet_m = ref.sgd_momentum(mxnet_w, grad * num_update, mxnet_m, lr, 0.9, 5e-3)
    assert np.abs(mxnet_w - expected_w).max() > 1e-3


@pytest.mark.parametrize("form", ["mxnet", "pytorch"])
@pytest.mark.parametrize("kind", ["ndarray", "numpy"])
def test_bank_update_without_momentum_is_sgd_with_momentum_zero(form, kind):
    """Test that the bank update with no momentum rows (bank_momentum=none) is NumPy's plain SGD
    at momentum SGD's built-up step, w - lr / (1 - momentum) (g + wd w) per row (decay scales
    included), in either form, and with momentum 0 equals, bit for bit, the update from a zero momentum."""
    schedule = WarmupMultiStepSchedule(0.2, warmup_steps=0, steps=[2], factor=0.1)
    scales = np.array([1.0, 12.5, 1.0, 3.0, 40.0], dtype=np.float32)
    weight, _, grad = _bank_rows(6)
    array = mx.nd.array if kind == "ndarray" else (lambda a: np.array(a, dtype=np.float32))
    as_numpy = (lambda a: a.asnumpy()) if kind == "ndarray" else np.asarray
    without, without_zero = array(weight), array(weight)
    with_zero, zeros = array(weight), array(np.zeros_like(weight))
    expected, expected_zero = weight, weight
    for num_update, lr in ((1, 0.2), (2, 0.02)):
        MemoryBankSGDOptimizer(schedule, momentum=0.9, wd=5e-3, momentum_form=form).update(
            without, None, array(grad), num_update, scales)
        MemoryBankSGDOptimizer(schedule, momentum=0.0, wd=5e-3, momentum_form=form).update(
            without_zero, None, array(grad), num_update, scales)
        MemoryBankSGDOptimizer(schedule, momentum=0.0, wd=5e-3, momentum_form=form).update(
            with_zero, zeros, array(grad), num_update, scales)
        expected = expected - lr / (1 - 0.9) * (grad + 5e-3 * scales[:, None] * expected)
        expected_zero = expected_zero - lr * (grad + 5e-3 * scales[:, None] * expected_zero)
        ref.assert_close(as_numpy(without), expected, 1e-5)
        ref.assert_close(as_numpy(without_zero), expected_zero, 1e-6)
        np.testing.assert_array_equal(as_numpy(without_zero), as_numpy(with_zero))


def _arrays(seed, shape=(3, 4)):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), rng.standard_normal(shape)


def _sgd(schedule=None, lr=0.1, **kwargs):
    return mx.optimizer.SGD(learning_rate=lr, momentum=0.9, wd=1e-2, lr_scheduler=schedule, **kwargs)


def test_distributed_update_equals_the_wrapped_sgd_at_world_size_1():
    """Test that BackboneOptimizer(SGD).update, for one index and for a group of indices (as
    Module's aggregated updater calls it), gives the weights and momenta of the bare SGD and of
    NumPy over three updates."""
    shapes = [(3, 4), (4,)]
    wrapped, bare = BackboneOptimizer(_sgd()), _sgd()
    rng = np.random.default_rng(3)
    start = [rng.standard_normal(s) for s in shapes]
    w_wrapped = [mx.nd.array(w) for w in start]
    w_bare = [mx.nd.array(w) for w in start]
    s_wrapped = [wrapped.create_state(i, w) for i, w in enumerate(w_wrapped)]
    s_bare = [bare.create_state(i, w) for i, w in enumerate(w_bare)]
    expected, moms = [w.copy() for w in start], [np.zeros(s) for s in shapes]
    for update in range(3):
        grads = [rng.standard_normal(s) for s in shapes]
        if update == 1:       # grouped call, the form Module's updater uses
            wrapped.update([0, 1], w_wrapped, [mx.nd.array(g) for g in grads], s_wrapped)
        else:
            for i in range(2):
                wrapped.update(i, w_wrapped[i], mx.nd.array(grads[i]), s_wrapped[i])
        for i in range(2):
            bare.update(i, w_bare[i], mx.nd.array(grads[i]), s_bare[i])
            expected[i], moms[i] = ref.sgd_momentum(expected[i], grads[i], moms[i], 0.1, 0.9, 1e-2)
    for i in range(2):
        np.testing.assert_array_equal(w_wrapped[i].asnumpy(), w_bare[i].asnumpy())
        np.testing.assert_array_equal(s_wrapped[i].asnumpy(), s_bare[i].asnumpy())
        ref.assert_close(w_wrapped[i].asnumpy(), expected[i], 1e-5)
        ref.assert_close(s_wrapped[i].asnumpy(), moms[i], 1e-5)
    assert wrapped.num_update == bare.num_update == 3


def test_the_backbone_is_updated_60_parameters_per_call_with_the_same_arithmetic():
    """Test that MXNet's updater (as Module calls it, all of a backbone's parameters at once)
    updates 130 parameters in 3 calls of the wrapped SGD's multi-tensor update (MXNet's default:
    4 per call, 33 calls), and that the weights and momenta after three updates are bit-equal to
    updating each parameter on its own."""
    rng = np.random.default_rng(11)
    shapes = [tuple(rng.integers(1, 9, rng.integers(1, 4))) for _ in range(130)]
    start = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    results = {}
    for kind in ("grouped", "one by one"):
        optimizer = BackboneOptimizer(_sgd(), momentum_form="pytorch")
        if kind == "one by one":
            optimizer._optimizer.aggregate_num = 0
        calls = []
        inner_update = optimizer.update_multi_precision
        optimizer.update_multi_precision = lambda *args: (calls.append(args[0]), inner_update(*args))
        updater = mx.optimizer.get_updater(optimizer)
        weights = [mx.nd.array(w) for w in start]
        for step in grads:
            updater(list(range(len(shapes))), [mx.nd.array(g) for g in step], weights)
        results[kind] = [w.asnumpy() for w in weights] + [updater.states[i].asnumpy() for i in range(len(shapes))]
        results[kind + " calls"] = calls
    assert [len(index) for index in results["grouped calls"]] == [60, 60, 10] * 3
    assert len(results["one by one calls"]) == 130 * 3
    for grouped, alone in zip(results["grouped"], results["one by one"]):
        np.testing.assert_array_equal(grouped, alone)


def test_pytorch_momentum_form_equals_torch_sgd_over_lr_changes():
    """Test that BackboneOptimizer(SGD, momentum_form="pytorch"), with sum_gradients before
    each update (world size 1), follows torch.optim.SGD's form in NumPy (buf = m buf + g + wd w;
    w -= lr buf) through a warm-up and an lr drop, while the "mxnet" form does not after the drop."""
    schedule = lambda: WarmupMultiStepSchedule(0.4, warmup_steps=3, steps=[5], factor=0.1)
    forms = {form: BackboneOptimizer(mx.optimizer.SGD(learning_rate=0.4, momentum=0.9, wd=1e-2,
                                                         lr_scheduler=schedule()), momentum_form=form)
             for form in ("pytorch", "mxnet")}
    rng = np.random.default_rng(5)
    start = rng.standard_normal((3, 4))
    weights = {form: mx.nd.array(start) for form in forms}
    states = {form: opt.create_state(0, weights[form]) for form, opt in forms.items()}
    expected, buf = start.copy(), np.zeros((3, 4))
    for num_update in range(1, 8):
        grad = rng.standard_normal((3, 4))
        for form, opt in forms.items():
            grad_nd = mx.nd.array(grad)
            opt.sum_gradients([[grad_nd]], num_update)
            opt.update(0, weights[form], grad_nd, states[form])
        lr = schedule()(num_update)
        buf = 0.9 * buf + grad + 1e-2 * expected
        expected = expected - lr * buf
        ref.assert_close(weights["pytorch"].asnumpy(), expected, 1e-5)
    assert np.abs(weights["mxnet"].asnumpy() - expected).max() > 1e-2


def torch_adamw_by_hand(weight, mean, var, grad, lr, wd, t, betas=(0.9, 0.999), eps=1e-8):
    """One step of torch.optim.AdamW as its documentation writes it, in float64 NumPy: the
    decoupled decay first, then the bias-corrected moments (returns weight, mean, var)."""
    weight = weight * (1 - lr * wd)
    mean = betas[0] * mean + (1 - betas[0]) * grad
    var = betas[1] * var + (1 - betas[1]) * grad ** 2
    step = (mean / (1 - betas[0] ** t)) / (np.sqrt(var / (1 - betas[1] ** t)) + eps)
    return weight - lr * step, mean, var


def test_adamw_equals_torch_adamw_through_the_warmup_decay_and_clipping():
    """Test that BackboneOptimizer(AdamW) with sum_gradients before each update (world size 1)
    follows torch.optim.AdamW's formula in NumPy over 12 steps of a warm-up and the polynomial
    decay, with the global norm clipped at 1 on every other step (gradients scaled by 3), and
    with decay on the weight but not the bias (MXNet's rule; decay_all decays both); SGD's momentum
    correction leaves AdamW's moments alone (the "pytorch" form)."""
    names = {0: "fc_weight", 1: "fc_bias"}
    for decay_all in (False, True):
        schedule = WarmupPolySchedule(1e-2, warmup_steps=3, max_update=12)
        opt = BackboneOptimizer(AdamW(learning_rate=1e-2, wd=0.1, lr_scheduler=schedule, rescale_grad=1.0),
                                clip_grad_norm=1.0, momentum_form="pytorch", decay_all=decay_all)
        opt.set_param_names(names)
        rng = np.random.default_rng(11)
        start = [rng.standard_normal((4, 3)), rng.standard_normal((4,))]
        weights = [mx.nd.array(w) for w in start]
        states = [opt.create_state(i, w) for i, w in enumerate(weights)]
        expected = [(w.copy(), np.zeros_like(w), np.zeros_like(w)) for w in start]
        for t in range(1, 13):
            grads = [rng.standard_normal(w.shape) * (3.0 if t % 2 else 0.1) for w in start]
            grads_nd = [mx.nd.array(g) for g in grads]
            norm = opt.sum_gradients([[g] for g in grads_nd], t)
            assert norm == pytest.approx(np.sqrt(sum((g ** 2).sum() for g in grads)), rel=1e-5)
            scale = min(1.0, 1.0 / norm)
            for i in names:
                opt.update(i, weights[i], grads_nd[i], states[i])
                wd = 0.1 if (i == 0 or decay_all) else 0.0
                expected[i] = torch_adamw_by_hand(*expected[i], grads[i] * scale, schedule(t), wd, t)
                ref.assert_close(weights[i].asnumpy(), expected[i][0], 1e-5)
        assert np.abs(expected[0][0] - start[0]).max() > 0.02      # it moved (lr <= 0.01)


def test_adamw_resumed_from_its_state_continues_exactly():
    """Test that an AdamW rebuilt at step 4 (set_num_update, its moments copied, as a resumed run
    restores them) takes steps 5-8 bit for bit as the one that never stopped: the bias
    corrections count from the run's step, not from the restart."""
    def make():
        return BackboneOptimizer(AdamW(learning_rate=1e-2, wd=0.05, rescale_grad=1.0,
                                       lr_scheduler=WarmupPolySchedule(1e-2, 2, 8)))
    rng = np.random.default_rng(3)
    grads = [mx.nd.array(rng.standard_normal((5, 2))) for _ in range(8)]
    weight = mx.nd.array(rng.standard_normal((5, 2)))
    straight, state = make(), None
    state = straight.create_state(0, weight)
    for t in range(1, 9):
        straight.update(0, weight, grads[t - 1], state)
        if t == 4:
            halfway = (weight.copy(), tuple(part.copy() for part in state))
    resumed = make()
    resumed.set_num_update(4)
    other, other_state = halfway[0], halfway[1]
    for t in range(5, 9):
        resumed.update(0, other, grads[t - 1], other_state)
    np.testing.assert_array_equal(other.asnumpy(), weight.asnumpy())
    fresh = make()                         # without set_num_update: t restarts at 1, a different step
    again, again_state = halfway[0].copy(), tuple(part.copy() for part in halfway[1])
    fresh.update(0, again, grads[4], again_state)
    assert np.abs(again.asnumpy() - other.asnumpy()).max() > 0


def test_set_param_names_gives_no_weight_decay_to_biases_and_betas():
    """Test that after set_param_names a zero-gradient update decays *_weight and *_gamma
    (MXNet's Module default) by lr*wd but leaves *_bias and *_beta untouched, as an SGD created
    with param_idx2name (what Module does) would."""
    names = {0: "fc_weight", 1: "fc_bias", 2: "bn_gamma", 3: "bn_beta"}
    opt = BackboneOptimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.0, wd=0.1))
    opt.set_param_names(names)
    module_made = mx.optimizer.SGD(learning_rate=0.5, momentum=0.0, wd=0.1, param_idx2name=names)
    after = {}
    for index, name in names.items():
        weight = mx.nd.full((2, 3), 2.0)
        opt.update(index, weight, mx.nd.zeros((2, 3)), opt.create_state(index, weight))
        after[name] = weight.asnumpy()
        assert opt._get_wd(index) == module_made._get_wd(index), name
    np.testing.assert_allclose(after["fc_weight"], 2.0 * (1 - 0.5 * 0.1), rtol=1e-6)
    np.testing.assert_allclose(after["bn_gamma"], 2.0 * (1 - 0.5 * 0.1), rtol=1e-6)
    np.testing.assert_array_equal(after["fc_bias"], 2.0)
    np.testing.assert_array_equal(after["bn_beta"], 2.0)


def test_decay_all_decays_biases_and_betas_too():
    """Test that with decay_all a zero-gradient update decays every parameter by lr*wd, biases
    and BatchNorm betas included (arcface_torch's SGD over every parameter)."""
    names = {0: "fc_weight", 1: "fc_bias", 2: "bn_gamma", 3: "bn_beta"}
    opt = BackboneOptimizer(mx.optimizer.SGD(learning_rate=0.5, momentum=0.0, wd=0.1), decay_all=True)
    opt.set_param_names(names)
    for index, name in names.items():
        weight = mx.nd.full((2, 3), 2.0)
        opt.update(index, weight, mx.nd.zeros((2, 3)), opt.create_state(index, weight))
        np.testing.assert_allclose(weight.asnumpy(), 2.0 * (1 - 0.5 * 0.1), rtol=1e-6, err_msg=name)


def test_set_num_update_continues_the_schedule_from_that_update():
    """Test that set_num_update(k) makes the next update use lr(k + 1), even after the counts had
    gone past k, and matches an SGD that starts at begin_num_update=k (a resumed run)."""
    def schedule():
        return WarmupMultiStepSchedule(1.0, warmup_steps=0, steps=[3, 6], factor=0.1)

    opt = BackboneOptimizer(mx.optimizer.SGD(learning_rate=1.0, momentum=0.0, wd=0.0,
                                                lr_scheduler=schedule()))
    weight, grad = mx.nd.zeros((2,)), mx.nd.ones((2,))
    state = opt.create_state(0, weight)
    for _ in range(7):                        # counts reach 7: lr 0.01 from now on
        opt.update(0, weight, grad, state)
    assert opt.num_update == 7
    for resume, lr in ((4, 0.1), (1, 1.0), (6, 0.01)):
        opt.set_num_update(resume)
        before = weight.asnumpy()
        opt.update(0, weight, grad, state)
        assert opt.num_update == resume + 1
        np.testing.assert_allclose(before - weight.asnumpy(), lr, rtol=1e-6)
        fresh = mx.optimizer.SGD(learning_rate=1.0, momentum=0.0, wd=0.0, lr_scheduler=schedule(),
                                 begin_num_update=resume)
        other = mx.nd.array(before)
        fresh.update(0, other, grad, fresh.create_state(0, other))
        np.testing.assert_array_equal(other.asnumpy(), weight.asnumpy())


def test_poly_and_cosine_schedules_match_their_formulas():
    """Test that poly is base * n / w during a warm-up of w steps, then base * (1 - t)^2 with
    t = (n - w) / (max - w), cosine base * (1 + cos(pi t)) / 2, both 0 at max_update and after,
    continuous at the warm-up's end, and pure functions of n (any call order)."""
    import math
    from sample_fc.optimizers import make_schedule
    base, warmup, total = 0.4, 10, 110
    poly = make_schedule("poly", base, warmup, total, [], 0.1)
    cosine = make_schedule("cosine", base, warmup, total, [], 0.1)
    for n in (0, 5, 10, 35, 60, 109, 110, 500):
        t = min(1.0, max(0, n - warmup) / (total - warmup))
        ramp = n / warmup if n < warmup else None
        assert poly(n) == pytest.approx(base * ramp if ramp is not None else base * (1 - t) ** 2, abs=1e-12)
        assert cosine(n) == pytest.approx(base * ramp if ramp is not None else base * (1 + math.cos(math.pi * t)) / 2,
                                          abs=1e-12)
    assert poly(total) == cosine(total) == 0.0 and poly(warmup) == cosine(warmup) == base
    assert poly(60) == pytest.approx(0.1) and cosine(60) == pytest.approx(0.2)   # t = 0.5 by hand
    order = [90, 3, 60, 10]
    assert [poly(n) for n in order] == [make_schedule("poly", base, warmup, total, [], 0.1)(n) for n in order]
    step = make_schedule("step", base, 0, total, [50], 0.1)
    assert (step(49), step(50)) == (pytest.approx(0.4), pytest.approx(0.04))


def test_schedule_kinds_are_checked():
    """Test that an unknown kind and a warm-up as long as the run are refused, naming them."""
    from sample_fc.optimizers import make_schedule
    with pytest.raises(ValueError, match="'linear'"):
        make_schedule("linear", 0.1, 0, 10, [], 0.1)
    with pytest.raises(ValueError, match="warmup_steps < max_update"):
        make_schedule("cosine", 0.1, 10, 10, [], 0.1)
