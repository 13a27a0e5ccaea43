"""Tests for sample_fc.pfc.sampling_regime and the not-learning watch (callbacks.ChanceWatch)."""
import math

import numpy as np
import pytest

from sample_fc.run.callbacks import ChanceWatch, chance_loss
from sample_fc.pfc.margin import CombinedMargin
from sample_fc.module import StepInfo
from sample_fc.pfc.sampling_regime import SAFE_DRAWS_PER_VISIT, regime, safe_ratio


def test_a_lossy_regime_is_stated_and_warned_with_the_ratio_that_avoids_it():
    """Test the issue's case, 5,000 classes, ratio 0.1, 2 workers of 64: q*K/B = 3.9, a warning
    naming ratio 0.9 (35 * 128 / 5000 = 0.896, rounded up) and its step cost by the FLOP model."""
    found = regime(0.1, 5000, 2, 64, 128, 18_000_000)
    assert found.draws == pytest.approx(0.1 * 5000 / 128) and found.lossy
    assert found.safe_ratio == 0.9 and found.sampled_per_rank == 250
    head = lambda rows: 6 * 128 * 128 * rows             # noqa: E731  three B x D x K GEMMs
    backbone = 6 * 18_000_000 * 64
    assert found.step_cost == pytest.approx((head(2250) + backbone) / (head(250) + backbone))
    assert "3.9 times per visit" in found.line() and "6.4 points" in found.line()
    assert "sample_ratio=0.1 is where sampling has cost accuracy" in found.warning()
    assert "sample_ratio=0.9 reaches 35" in found.warning()


@pytest.mark.parametrize("classes, world, batch", [(1_000_000, 8, 128), (100_000_000, 64, 128), (360_232, 8, 128)])
def test_a_safe_regime_has_no_warning(classes, world, batch):
    """Test that at 1M and 100M classes (and Glint360K on 8 workers, the published parity) ratio
    0.1 is safe: no warning, and the safe ratio is below it."""
    found = regime(0.1, classes, world, batch, 512, 12_000_000_000)
    assert found.draws >= SAFE_DRAWS_PER_VISIT and not found.lossy and found.warning() is None
    assert safe_ratio(classes, world * batch) <= 0.1


def test_ratio_one_is_never_lossy_and_the_safe_ratio_is_capped():
    """Test that the full softmax is never warned about, whatever q*K/B, and safe_ratio is at most 1."""
    assert regime(1.0, 200, 2, 64, 128, 1e7).warning() is None
    assert safe_ratio(200, 128) == 1.0
    assert safe_ratio(5000, 128) == math.ceil(100 * 35 * 128 / 5000) / 100


def test_chance_loss_by_hand():
    """Test chance against its hand value: CosFace (s 32, m3 0.25) at 5,000 classes is
    log(4999 + e^-8) + 8, ArcFace (s 64, m2 0.5) log(K - 1 + e^(-64 sin 0.5)) + 64 sin 0.5."""
    assert chance_loss(5000, CombinedMargin(1.0, 0.0, 0.25, 32.0)) == pytest.approx(math.log(4999 + math.exp(-8)) + 8)
    arc = 64 * math.sin(0.5)
    assert chance_loss(100, CombinedMargin(1.0, 0.5, 0.0, 64.0)) == pytest.approx(math.log(99 + math.exp(-arc)) + arc,
                                                                                  rel=1e-5)


def _info(step, loss, norm):
    return StepInfo(step, loss, 0.1, 128, 0.1, False, norm)


def test_the_watch_warns_once_on_a_plateau_and_not_on_a_learning_curve():
    """Test the watch on scripted curves: a loss at chance with a small gradient after the warm-up
    is said once; the same before the warm-up, a falling loss, or a large gradient is not."""
    said = []
    watch = ChanceWatch(16.5, start=100, warn=said.append, window=50)
    for step in range(1, 400):
        watch(_info(step, 17.0 + 0.1 * np.sin(step), 0.4))
    assert len(said) == 1 and "step 150" in said[0] and "chance level 16.50" in said[0]
    quiet = []
    learning = ChanceWatch(16.5, start=100, warn=quiet.append, window=50)
    steep = ChanceWatch(16.5, start=100, warn=quiet.append, window=50)
    for step in range(1, 400):
        learning(_info(step, 17.0 - 0.05 * step, 0.4))
        steep(_info(step, 17.0, 3.0))
    assert quiet == []


@pytest.mark.parametrize("classes, world, batch", [(5000, 2, 64), (200, 2, 64), (1_000_000, 8, 128),
                                                   (100_000_000, 64, 128), (360_232, 1, 64)])
def test_auto_is_the_smallest_safe_ratio(classes, world, batch):
    """Test that sample_ratio=auto resolves, per world size, to the smallest ratio (in hundredths)
    with q*K/B >= 35, or 1.0; that it says so; and that the weight-decay correction comes on
    from ratio 0.5 (where it measured as helping) and not below."""
    import default
    from sample_fc.builder import resolve_auto
    cfg = default.config_for_run('demo', None, None, [f"num_classes={classes}", f"batch_size={batch}",
                                                      "sample_ratio=auto"])
    assert cfg.sample_ratio == 'auto'
    line = resolve_auto(cfg, world)["sample_ratio"]
    global_batch = world * batch
    want = min(1.0, math.ceil(100 * 35 * global_batch / classes) / 100)
    assert cfg.sample_ratio == want and f"sample_ratio=auto: {want:g}" in line
    assert want == 1.0 or want * classes / global_batch >= 35 > (want - 0.01) * classes / global_batch
    assert cfg.sample_wd_correction == (0.5 <= want < 1.0)
    default.check_config(cfg)
    assert "sample_ratio" not in resolve_auto(cfg, world)      # a number stays as it is


def test_a_resumed_auto_run_keeps_its_ratio_and_auto_is_checked():
    """Test that a run saved with the resolved ratio resumes with it (auto is not re-chosen for a
    new world size), that asking for auto again on resume is refused, and a bad word is one error."""
    import default
    saved = default.config_for_run('demo', None, None, ["num_classes=5000", "sample_ratio=auto"])
    saved.sample_ratio = 0.9                          # as train.py saved it (resolve_auto)
    resumed = default.config_for_run(None, None, None, [], resumed=dict(saved))
    assert resumed.sample_ratio == 0.9
    from sample_fc.errors import UsageError
    with pytest.raises(UsageError, match="sample_ratio"):
        default.config_for_run(None, None, None, ["sample_ratio=auto"], resumed=dict(saved))
    with pytest.raises(UsageError, match="sample_ratio"):
        default.config_for_run('demo', None, None, ["sample_ratio=automatic"])
