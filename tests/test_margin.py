"""Tests for sample_fc.pfc.margin: the combined margin psi and its derivative."""
import mxnet as mx
import numpy as np
import pytest

import reference as ref
from sample_fc.pfc.margin import CombinedMargin

CASES = {"arcface": (1.0, 0.5, 0.0), "cosface": (1.0, 0.0, 0.4), "combined": (1.2, 0.3, 0.1)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_psi_matches_numpy(name):
    """Test that psi and its slope equal the NumPy formulas away from the clamp."""
    m1, m2, m3 = CASES[name]
    c = np.linspace(-0.999, 0.999, 2001)
    value, slope = CombinedMargin(m1, m2, m3).psi_and_derivative(mx.nd.array(c, dtype="float64"))
    np.testing.assert_allclose(value.asnumpy(), ref.psi(c, m1, m2, m3), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(slope.asnumpy(), ref.psi_slope(c, m1, m2, m3), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(CASES))
def test_psi_monotone_in_theta(name):
    """Test that the target logit never increases as theta goes from 0 to pi."""
    theta = np.linspace(0.0, np.pi, 4001)
    value = CombinedMargin(*CASES[name]).psi(mx.nd.array(np.cos(theta), dtype="float64")).asnumpy()
    assert np.all(np.diff(value) <= 1e-12)
    assert value[0] > value[-1]


@pytest.mark.parametrize("name", sorted(CASES))
def test_slope_finite_at_the_ends(name):
    """Test that d psi / dc is finite (and positive) at cos = 1 and cos = -1, in float32."""
    _, slope = CombinedMargin(*CASES[name]).psi_and_derivative(mx.nd.array([1.0, -1.0, 0.0]))
    slope = slope.asnumpy()
    assert np.all(np.isfinite(slope)) and np.all(slope > 0), slope


def test_continuation_is_continuous_and_finite_past_pi():
    """Test that psi is continuous where m1*theta + m2 crosses pi (ArcFace, theta* = pi - 0.5)."""
    margin = CombinedMargin(1.0, 0.5, 0.0)
    theta_star = np.pi - 0.5
    c = np.cos([theta_star - 1e-7, theta_star + 1e-7])
    value = margin.psi(mx.nd.array(c, dtype="float64")).asnumpy()
    assert abs(value[0] - value[1]) < 1e-6 and abs(value[0] + 1.0) < 1e-6


def test_bad_margins_are_rejected():
    """Test that invalid margins raise errors naming the value."""
    with pytest.raises(ValueError, match="m1=0"):
        CombinedMargin(0.0, 0.5, 0.0)
    with pytest.raises(ValueError, match="nan"):
        CombinedMargin(1.0, float("nan"), 0.0)


def test_margin_warmup_grows_linearly_to_the_target():
    """Test that MarginWarmup gives m2, m3 scaled by n / steps, m1 from 1 to its value, s fixed,
    the target itself from `steps` on, and psi equal to the plain cosine at update 0."""
    from sample_fc.pfc.margin import MarginWarmup
    target = CombinedMargin(1.2, 0.5, 0.1, 64.0)
    warm = MarginWarmup(target, 10)
    half = warm(5)
    assert (half.m1, half.m2, half.m3, half.s) == pytest.approx((1.1, 0.25, 0.05, 64.0))
    assert warm(10) is target and warm(500) is target
    c = mx.nd.array([-0.5, 0.1, 0.9])
    np.testing.assert_allclose(warm(0).psi(c).asnumpy(), c.asnumpy(), atol=1e-6)
    assert MarginWarmup(target, 0)(1) is target and MarginWarmup(target)(0) is target   # no warm-up
    with pytest.raises(ValueError, match="steps >= 0"):
        MarginWarmup(target, -1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_psi_on_numpy_equals_psi_on_ndarray(name):
    """Test that the one margin formula gives the host kernel (NumPy arrays) what it gives the
    device kernel (NDArrays), in float32, across the clamp and the continuation past pi."""
    c = np.concatenate([np.linspace(-1.0, 1.0, 999), [-1.0, 1.0]]).astype(np.float32)
    margin = CombinedMargin(*CASES[name])
    on_numpy = margin.psi_and_derivative(c)
    on_ndarray = margin.psi_and_derivative(mx.nd.array(c))
    for host, device in zip(on_numpy, on_ndarray):
        assert isinstance(host, np.ndarray) and host.dtype == np.float32
        np.testing.assert_allclose(host, device.asnumpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m1, m3, key, value", [(1.2, 0.0, "loss_m1", 1.2), (1.0, 0.25, "loss_m3", 0.25),
                                                (0.9, 0.1, "loss_m1", 0.9)])
def test_curricularface_keys_are_one_rule_for_the_config_and_the_layer(m1, m3, key, value):
    """Test that CurricularFace with loss_m1 != 1 or loss_m3 != 0 is refused in the same words by
    the config (one line naming the first bad key and its value) and by make_margin, and that
    m1 = 1, m3 = 0 builds it with its margin from m2."""
    import default
    from sample_fc.errors import UsageError
    from sample_fc.pfc.margin import CurricularFace, make_margin
    expected = "expected 1 with loss_margin" if key == "loss_m1" else "expected 0 with loss_margin"
    with pytest.raises(UsageError, match=rf"config key '{key}' is {value!r}; {expected}=curricularface"):
        default.config_for_run(loss='curricularface', overrides=[f"loss_m1={m1}", f"loss_m3={m3}"])
    with pytest.raises(ValueError, match=rf"^{key}={value:g}; {expected}=curricularface \(its margin is loss_m2\)$"):
        make_margin("curricularface", m1, 0.4, m3, 32.0)
    built = make_margin("curricularface", 1.0, 0.4, 0.0, 32.0)
    assert isinstance(built, CurricularFace) and built.m == 0.4


def test_the_published_margins_are_the_papers_values():
    """Test that the loss presets the configuration offers are the margin words' published
    settings: ArcFace 0.5 rad, CosFace 0.4 on the cosine, CurricularFace m = 0.5."""
    from sample_fc.config import presets
    assert presets.LOSS_PRESETS == {
        "arcface": {"loss_margin": "combined", "loss_m1": 1.0, "loss_m2": 0.5, "loss_m3": 0.0},
        "cosface": {"loss_margin": "combined", "loss_m1": 1.0, "loss_m2": 0.0, "loss_m3": 0.4},
        "curricularface": {"loss_margin": "curricularface", "loss_m1": 1.0, "loss_m2": 0.5, "loss_m3": 0.0}}


def test_a_new_margin_is_its_class_and_kind_in_margin_py_alone(tmp_path):
    """Test that a margin word written only into a copy of pfc/margin.py (a class and its Kind:
    the keys it fixes, a published setting) is a loss preset and a loss_margin of train.py, that
    its fixed key is refused in one line naming it, and that the layer builds its margin (the
    target logit's psi(c) = c - m3 by the NumPy formula)."""
    import json
    import subprocess
    import sys
    from conftest import package_copy
    env = package_copy(tmp_path)
    margin_py = tmp_path / "sample_fc" / "pfc" / "margin.py"
    text = margin_py.read_text()
    assert text.count("KINDS = {\n") == 1 and text.count("\nclass Kind(") == 1
    new_class = ("class CosineOnly(CombinedMargin):\n    def __init__(self, m3, s):\n"
                 "        super().__init__(1.0, 0.0, m3, s)\n\n\n")
    new_kind = ("    'cosine_only': Kind(lambda m1, m2, m3, s: CosineOnly(m3, s), {'loss_m2': 0.0}, 'a cosine margin',\n"
                "                        {'lmcl': {'loss_m1': 1.0, 'loss_m2': 0.0, 'loss_m3': 0.35}}),\n")
    margin_py.write_text(text.replace("\nclass Kind(", "\n" + new_class + "class Kind(")
                         .replace("KINDS = {\n", "KINDS = {\n" + new_kind))

    def train(*args):
        return subprocess.run([sys.executable, "train.py", "--dataset", "demo", *args, "--print-config"],
                              capture_output=True, text=True, timeout=300, env=env, cwd=str(tmp_path))
    printed = train("--loss", "lmcl")
    assert printed.returncode == 0, printed.stderr[-3000:]
    cfg = json.loads(printed.stdout)
    assert (cfg["loss"], cfg["loss_margin"], cfg["loss_m2"], cfg["loss_m3"]) == ("lmcl", "cosine_only", 0.0, 0.35)
    refused = train("--loss", "lmcl", "--set", "loss_m2=0.2")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "train.py: error: config key 'loss_m2' is 0.2; expected 0 with loss_margin=cosine_only (a cosine margin) (see train.py --help)"]
    script = ("import json, numpy as np\nfrom sample_fc.pfc.margin import make_margin\n"
              "m = make_margin('cosine_only', 1.0, 0.0, 0.35, 30.0)\nc = np.linspace(-1, 1, 9)\n"
              "print(json.dumps([type(m).__name__, m.s, m.psi(c).tolist(), c.tolist()]))")
    built = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env,
                           cwd=str(tmp_path))
    assert built.returncode == 0, built.stderr[-3000:]
    name, scale, psi, c = json.loads(built.stdout)
    assert name == "CosineOnly" and scale == 30.0
    np.testing.assert_allclose(psi, np.array(c) - 0.35, atol=1e-12)
