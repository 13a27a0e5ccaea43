"""Tests for sample_fc.run.experiment_file (`train.py --config FILE`): a file's lines say what --set
says (generated keys and values: the same config, or the same one-line error with the file and
line in front), the command line wins, and every bad file is one line."""
import argparse
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

from sample_fc.errors import UsageError
from sample_fc.run.experiment_file import read_experiment
from test_config_surface import EXAMPLES, override_cases

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import default  # noqa: E402


def outcome(dataset, network, loss, overrides):
    """config_for_run's config, or its error line."""
    try:
        return dict(default.config_for_run(dataset, network, loss, overrides))
    except UsageError as error:
        return f"error: {error}"


def from_file(tmp_path, text, dataset=None, network=None, loss=None, overrides=()):
    """What train.py resolves for `--config FILE` (holding `text`) with these options."""
    path = tmp_path / "exp.cfg"
    path.write_text(text, encoding="utf-8")
    args = argparse.Namespace(dataset=dataset, network=network, loss=loss, overrides=list(overrides))
    read_experiment(str(path)).merged_into(args)
    return outcome(args.dataset, args.network, args.loss, args.overrides)


@EXAMPLES
@given(case=override_cases(), spaces=st.sampled_from(["{k}={v}", "{k} = {v}", "  {k}\t=  {v}  # a note"]))
def test_a_line_says_what_set_says(tmp_path_factory, case, spaces):
    """Test that a generated `key = value` line (any key, values it takes and values it refuses)
    resolves, under any preset, to the config `--set key=value` gives, or is refused with
    --set's own message behind the file's name and line number."""
    dataset, network, loss, key, text = case
    value = text.strip()
    assume(len(f"x{text}x".splitlines()) == 1 and "#" not in text)
    assume(not (len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'"))   # quotes: the next test
    tmp_path = tmp_path_factory.mktemp("line")
    want = outcome(dataset, network, loss, [f"{key}={value}"])
    line = "# an experiment\n\n" + spaces.format(k=key, v=text) + "\n"
    try:
        got = from_file(tmp_path, line, dataset, network, loss)
    except UsageError as error:
        assert want.startswith("error: ") and str(error) == f"--config {tmp_path / 'exp.cfg'}, line 3: {want[7:]}"
        return
    assert got == want


def test_presets_and_set_on_the_command_line_win_and_quotes_and_comments_are_read(tmp_path):
    """Test that the file's dataset/network/loss choose presets unless the command line names
    them, that --set comes after the file's lines, that a quoted value loses its quotes and a
    `#` inside a value stays, and that old key names are read under their new ones."""
    text = ('dataset = custom   # my set\nnetwork = mbf\nrec = "/data/set #2/train.rec"\nmax_update = 40\n'
            'lr_steps = [20, 30]\nverbose = 5\n')
    got = from_file(tmp_path, text, overrides=["max_update=50"])
    want = outcome("custom", "mbf", None, ["rec=/data/set #2/train.rec", "max_update=50", "lr_steps=[20, 30]",
                                           "verify_period=5"])
    assert got == want and got["rec"] == "/data/set #2/train.rec" and got["max_update"] == 50
    assert from_file(tmp_path, text, network="r50")["network"] == "r50"
    assert from_file(tmp_path, "max_update = 7\n")["dataset"] == "demo"
    assert from_file(tmp_path, "\ufeffmax_update = 8\n")["max_update"] == 8      # a byte-order mark first


@pytest.mark.parametrize("text, message", [
    ("max_update = 6\nlr_stepz = [3]\n", "line 2: unknown config key 'lr_stepz'; did you mean 'lr_steps'?"),
    ("max_update = six\n", "line 1: config key 'max_update' is 'six'; expected an integer"),
    ("dataset = demox\n", "line 1: dataset = 'demox'; expected one of: demo, custom"),
    ("max_update = 6\n\nmax_update=7\n", "line 3: max_update is set twice (line 1 sets it too)"),
    ("verbose = 5\nverify_period = 6\n", "line 2: verify_period is set twice (line 1 sets it too)"),
    ("just some words\n", "line 1: 'just some words' is not a `key = value` line"),
    ("= 5\n", "line 1: '= 5' is not a `key = value` line"),
])
def test_a_bad_line_is_one_line_naming_the_file_and_the_line(tmp_path, text, message):
    path = tmp_path / "exp.cfg"
    path.write_text(text)
    with pytest.raises(UsageError) as error:
        read_experiment(str(path))
    assert str(error.value).startswith(f"--config {path}, {message}") and "\n" not in str(error.value)


def test_a_missing_unreadable_or_binary_file_is_one_line(tmp_path):
    binary = tmp_path / "model.params"
    binary.write_bytes(b"\x00\xff\xfe" * 100)
    for path, message in ((tmp_path / "none.cfg", "no such file"), (tmp_path, "is a directory"),
                          (binary, "is not UTF-8 text")):
        with pytest.raises(UsageError, match=f"^--config {path}:? {message}"):
            read_experiment(str(path))


@EXAMPLES
@given(text=st.text(max_size=200))
def test_any_text_is_read_or_refused_in_one_line(tmp_path_factory, text):
    """Test that a file of any text is an experiment or one UsageError line, never another error."""
    path = tmp_path_factory.mktemp("any") / "exp.cfg"
    path.write_text(text, encoding="utf-8")
    try:
        experiment = read_experiment(str(path))
    except UsageError as error:
        assert "\n" not in str(error)
        return
    assert all("=" in line for line in experiment.overrides)
