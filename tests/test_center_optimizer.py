"""Test the centers' optimizer rule (pfc/center_optimizer.py) and bank_momentum=auto's resolution."""
import pytest
from hypothesis import given, settings, strategies as st

from sample_fc.pfc.center_optimizer import MOMENTUM_UNTIL_GAP, center_optimizer


@settings(max_examples=200, deadline=None)
@given(classes=st.integers(1, 10 ** 9), world=st.integers(1, 64), batch=st.integers(1, 1024))
def test_auto_keeps_momentum_only_while_classes_come_back_soon(classes, world, batch):
    """Test that bank_momentum=auto resolves to momentum stored as the weights exactly when a
    class comes back within MOMENTUM_UNTIL_GAP steps (C / B, B the global batch), else to none,
    that the config holds the choice, and that the line names the choice and the gap."""
    import default
    from sample_fc.builder import centers_line, resolve_auto
    cfg = default.config_for_run('demo', None, None, [f"num_classes={classes}", f"batch_size={batch}",
                                                      "bank_momentum=auto"])
    lines = resolve_auto(cfg, world)
    gap = classes / (world * batch)
    assert cfg.bank_momentum == ("same" if gap < MOMENTUM_UNTIL_GAP else "none")
    line = lines["bank_momentum"]
    assert line == centers_line(cfg, world, lines)
    assert line.startswith("class centers: " + ("SGD with momentum 0.9" if gap < MOMENTUM_UNTIL_GAP
                                                 else "plain SGD at lr / (1 - 0.9), no momentum"))
    assert f"bank_momentum=auto: a class comes back every {gap:.1f} steps (C/B)" in line
    default.check_config(cfg)
    assert "bank_momentum" not in resolve_auto(cfg, world)      # a resolved word stays as it is


@pytest.mark.parametrize("word,starts", [("same", "SGD with momentum 0.9 ("), ("int8", "SGD with momentum 0.9 (8-bit)"),
                                         ("none", "plain SGD")])
def test_a_set_word_is_said_as_set(word, starts):
    """Test that a bank_momentum other than auto is kept whatever the gap, and said as it is."""
    found = center_optimizer(word, 0.9, 20000, 128)
    assert found.bank_momentum == word and not found.automatic
    assert found.line().startswith("class centers: " + starts)
    assert f"bank_momentum={word}; a class comes back every 156.2 steps" in found.line()


def test_a_resumed_run_keeps_its_centers_optimizer():
    """Test that a run saved with the resolved word resumes with it (auto is not re-chosen for
    another world size) and that asking for auto on resume is refused in one error."""
    import default
    from sample_fc.errors import UsageError
    saved = default.config_for_run('demo', None, None, ["num_classes=5000", "bank_momentum=auto"])
    saved.bank_momentum = "none"                      # as train.py saved it (resolve_auto)
    resumed = default.config_for_run(None, None, None, [], resumed=dict(saved))
    assert resumed.bank_momentum == "none"
    with pytest.raises(UsageError, match="bank_momentum"):
        default.config_for_run(None, None, None, ["bank_momentum=auto"], resumed=dict(saved))


@pytest.mark.parametrize("classes, quoted", [(640, "at C/B 1.6,"), (1280, "at C/B 39.1,"), (10 ** 6, "at C/B 156.2,")])
def test_the_line_quotes_the_measured_point_nearest_on_a_log_scale(classes, quoted):
    """Test that the start-up line quotes the measured gap nearest the run's on a log scale (C/B
    10 is nearer 39.1 than 1.6 by ratio, though not by difference), as the sampling regime's does."""
    assert quoted in center_optimizer("auto", 0.9, classes, 128).line()
