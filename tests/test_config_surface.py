"""Property-based tests of the config surface: every preset x every key x generated values of
every kind, through config_for_run (`--set`, a resumed run's saved config) and train.py.

The property: a config that passes check_config, or one UsageError line naming the key, never
another exception. Where a generated text is plainly a value the key takes (a decimal integer in
range, a finite number in range, one of its words) an oracle written here says it must be taken.
"""
import io
import json
import math
import os
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from sample_fc.config import Choice, Flag, Int, ListOf, Real, Text
from sample_fc.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import sample_fc.config as configuration  # noqa: E402
from sample_fc.config import presets  # noqa: E402

KEYS = configuration.KEYS
PRESET_KEYS = ('dataset', 'network', 'loss')
SETTABLE = sorted(set(KEYS) - set(PRESET_KEYS))
# The suite runs a fixed (derandomized) 400 examples per property; SAMPLE_FC_SURFACE_EXAMPLES=N runs N
# fresh random ones each, and N/10 through train.py and tools.plan (the long run: docs/file-formats.md, "Reliability").
LONG_RUN = int(os.environ.get('SAMPLE_FC_SURFACE_EXAMPLES', '0'))
EXAMPLES = settings(max_examples=LONG_RUN or 400, derandomize=not LONG_RUN, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

# ---- generated values ----------------------------------------------------------------------
ODD_TEXTS = ['', ' ', 'auto', 'AUTO', ' auto ', 'none', 'None', 'null', 'true', 'false', 'yes', '[]', '[1, 2]',
             '{}', '1,2', ',', '1,,2', 'nan', 'NaN', '-inf', 'inf', '1e400', '-1e400', '9' * 400, '0x10', '1_000',
             ' 7 ', '[[1]]', '["a"]', '[null]', '[true]', '[1.5]', 'SIGTERM', 'SIGKILL', '-0', '0.0', '-1', '1e-320',
             '\t', 'é', '\u0663', 'a=b', '=', '[' * 2000, '"x"', '1e3', '2 ** 40', str(2 ** 63), str(-2 ** 63)]
ALL_WORDS = sorted({word for kind in KEYS.values() if isinstance(kind, Choice) for word in kind.choices})
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                           max_leaves=8)


def texts_for(kind):
    """Override texts for a key of `kind`: ones it takes, ones just outside, and any text."""
    near = {
        Int: lambda k: st.integers((k.lo or 0) - 3, min(k.hi or 2 ** 64, (k.lo or 0) + 10 ** 6)).map(str)
        | st.integers(-2 ** 70, 2 ** 70).map(str),
        Real: lambda k: st.floats(allow_nan=True, allow_infinity=True).map(repr)
        | st.floats((k.lo or 0) - 1, (k.hi if k.hi is not None else 10.0) + 1).map(repr) | st.integers().map(str),
        Flag: lambda k: st.sampled_from(['true', 'false', 'TRUE', 'No', '1', '0', 'yes', 'maybe', '2']),
        Choice: lambda k: st.sampled_from(list(k.choices) + [c.upper() for c in k.choices] + [f" {c} " for c in k.choices]),
        Text: lambda k: st.text(max_size=20),
        ListOf: lambda k: st.lists(st.integers(-3, 10 ** 7), max_size=4).map(lambda xs: ','.join(map(str, xs)))
        | st.lists(json_scalars, max_size=4).map(json.dumps)
        | st.lists(st.sampled_from(['SIGTERM', 'SIGINT', 'SIGUSR1', 'SIGHUP', 'lfw', 'a/b', '']), max_size=3).map(','.join),
    }[type(kind)](kind)
    anything = st.one_of(st.sampled_from(ODD_TEXTS), st.sampled_from(ALL_WORDS), st.text(max_size=30),
                         json_values.map(json.dumps))
    return st.one_of(near, anything)


@st.composite
def override_cases(draw, keys=SETTABLE):
    """(dataset, network, loss, key, text): a preset combination and one generated override."""
    key = draw(st.sampled_from(keys))
    return (draw(st.sampled_from(configuration.DATASETS)), draw(st.sampled_from((None,) + configuration.NETWORKS)),
            draw(st.sampled_from((None,) + configuration.LOSSES)), key, draw(texts_for(KEYS[key])))


# ---- an oracle for plain values ------------------------------------------------------------
def _in_range(kind, number):
    lo_ok = kind.lo is None or (number > kind.lo if getattr(kind, 'lo_open', False) else number >= kind.lo)
    hi_ok = kind.hi is None or (number < kind.hi if getattr(kind, 'hi_open', False) else number <= kind.hi)
    return lo_ok and hi_ok


def plainly_taken(kind, text):
    """The value `text` must give when it is plainly one the key takes, else None (no claim)."""
    plain = text.strip()
    if plain.lower() in kind.words:
        return plain.lower()
    if isinstance(kind, Int) and re.fullmatch(r'[+-]?[0-9]{1,30}', plain):
        number = int(plain)
        return number if _in_range(kind, number) and not (kind.multiple and number % kind.multiple) else None
    if isinstance(kind, Real) and re.fullmatch(r'[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]{1,3})?', plain):
        number = float(plain)
        float32_sized = number == 0 or abs(number) >= 1.1754943508222875e-38   # MXNet reads float32 attributes
        return number if math.isfinite(number) and _in_range(kind, number) and float32_sized else None
    if isinstance(kind, Choice) and plain in kind.choices:
        return plain
    if isinstance(kind, Flag) and plain.lower() in ('true', 'false'):
        return plain.lower() == 'true'
    return None


def _one_line_naming(error, key):
    message = str(error)
    assert '\n' not in message, message
    assert repr(key) in message or f"{key}=" in message, (key, message)


# ---- the properties --------------------------------------------------------------------------
@EXAMPLES
@given(override_cases())
def test_any_override_on_any_preset_gives_a_checked_config_or_one_line_naming_the_key(case):
    """Test that `--set key=text` on any preset combination, with text of any kind (valid, wrong
    kind, out of range, words, empty, NaN/inf, huge, lists where scalars go and back), gives a
    config that passes check_config and survives being saved and resumed unchanged, or one
    UsageError line naming the key; and that a plainly valid value is taken as that value."""
    dataset, network, loss, key, text = case
    taken = plainly_taken(KEYS[key], text)
    try:
        cfg = configuration.config_for_run(dataset, network, loss, [f"{key}={text}"])
    except UsageError as error:
        _one_line_naming(error, key)
        message = str(error)
        crosses = ('warmup_steps' in message and key in ('max_update', 'lr_schedule', 'warmup_steps')
                   or "with loss_margin=curricularface" in message and key in ('loss_margin', 'loss_m1', 'loss_m3'))
        assert taken is None or crosses, (key, text, message)
        return
    configuration.check_config(cfg, data=False)
    if taken is not None:
        assert cfg[key] == taken and type(cfg[key]) is type(taken), (key, text, cfg[key])
    saved = json.loads(json.dumps(cfg))
    if (cfg.rec or cfg.synthetic) and cfg.num_classes >= 1:     # a run that names its data resumes as saved
        assert configuration.config_for_run(resumed=saved) == cfg


@EXAMPLES
@given(st.lists(st.one_of(override_cases().map(lambda case: f"{case[3]}={case[4]}"), st.text(max_size=20)),
                min_size=1, max_size=4), st.sampled_from(configuration.DATASETS))
def test_several_overrides_or_malformed_ones_give_a_config_or_one_line(overrides, dataset):
    """Test that a list of overrides, some malformed (no '=', no key, an unknown key), gives a
    checked config or one UsageError line; never another exception."""
    try:
        cfg = configuration.config_for_run(dataset, None, None, overrides)
    except UsageError as error:
        assert '\n' not in str(error)
        return
    configuration.check_config(cfg, data=False)


def _saved_run(dataset):
    rec = ['rec=/data/set/train.rec', 'num_classes=1000'] if dataset == 'custom' else []
    return json.loads(json.dumps(configuration.config_for_run(dataset, None, None, rec)))


@EXAMPLES
@given(st.sampled_from(configuration.DATASETS),
       st.sampled_from(sorted(KEYS) + ['sgd_momentum', 'verbose', 'not_a_key']),
       st.one_of(json_values, st.just('__delete__')))
def test_a_damaged_saved_config_resumes_or_is_refused_in_one_line(dataset, key, value):
    """Test that a resumed run's saved config with one key holding any JSON value (or missing,
    or an old or unknown name) resumes as a checked config or is refused in one UsageError line
    naming the key; never another exception."""
    saved = _saved_run(dataset)
    if value == '__delete__':
        saved.pop(key, None)
    else:
        saved[key] = value
    try:
        cfg = configuration.config_for_run(resumed=saved)
    except UsageError as error:
        assert '\n' not in str(error), str(error)
        assert key in str(error) or key in configuration.RENAMED_KEYS, (key, value, str(error))
        return
    configuration.check_config(cfg)
    if key in KEYS and value != '__delete__':
        assert cfg[key] == KEYS[key].accept(key, value)


@pytest.mark.parametrize('saved', [[], 'config', 3, {'dataset': 'nope'}, {'dataset': ['demo']},
                                   {'network': 7}, {'loss': 'sphereface'}])
def test_a_saved_config_that_is_no_config_is_refused_in_one_line(saved):
    """Test that a saved config that is not an object of keys, or names presets this version
    does not know (or as another kind), is one UsageError line."""
    with pytest.raises(UsageError) as error:
        configuration.config_for_run(resumed=saved)
    assert '\n' not in str(error.value) and 'saved config' in str(error.value)


def test_every_declared_default_is_taken_by_its_own_type():
    """Test that each key's declared default is a value its declared type takes (as itself), and
    each preset value one its key's type takes (the networks' and their families' recipes from
    symbols/catalog.py): the table cannot contradict itself."""
    from sample_fc.symbols import catalog
    for key, kind in KEYS.items():
        assert kind.accept(key, kind.default) == kind.default, key
    networks = {name: catalog.preset(name) for name in catalog.NETWORKS}
    recipes = {family: recipe['keys'] for family, recipe in catalog.FAMILY_RECIPES.items()}
    for table in (networks, recipes, presets.DATASET_PRESETS, presets.LOSS_PRESETS):
        for name, values in table.items():
            for key, value in values.items():
                assert KEYS[key].accept(key, value) == value, (name, key)


# ---- through train.py, in this process ---------------------------------------------------------
@pytest.fixture(scope='module')
def tiny_set(tmp_path_factory):
    from sample_fc.tools.demo_data import make_demo
    folder = tmp_path_factory.mktemp('surface')
    make_demo(str(folder / 'set'), num_identities=6, images_per_identity=2, num_val_identities=4,
              num_pairs=10, image_size=32, progress=False)
    return folder / 'set' / 'train.rec'


def _run_main(main, argv):
    """(exit code, stdout, stderr) of main(argv) in this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
    return code, out.getvalue(), err.getvalue()


@settings(max_examples=LONG_RUN // 10 or 25, derandomize=not LONG_RUN, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=override_cases(keys=[key for key in SETTABLE if key not in ('rec', 'synthetic')]))
def test_train_print_config_takes_generated_overrides_or_says_one_line(case, tiny_set):
    """Test that train.py --print-config, with the set named and one generated override, prints
    the resolved config as JSON (exit 0) or one `train.py: error:` line naming the key (exit 2)."""
    import train
    from unittest import mock
    dataset, network, loss, key, text = case
    argv = ['--dataset', dataset, '--set', f'rec={tiny_set}', '--set', f'{key}={text}', '--print-config']
    argv += ['--network', network] if network else []
    argv += ['--loss', loss] if loss else []
    with mock.patch.object(train.dist, 'is_started', return_value=False):   # an earlier test may have
        code, out, err = _run_main(train.main, argv)                        # started Horovod here: its
    assert 'Traceback' not in err                                           # os._exit would end pytest
    if code == 0:
        printed = json.loads(out)
        configuration.check_config(configuration.config_for_run(resumed=printed))
        return
    lines = [line for line in err.splitlines() if line.startswith('train.py: error:')]
    assert code == 2 and len(lines) == 1, (case, code, err)
    assert key in lines[0] or 'property file' in lines[0], (case, lines[0])


# ---- the tools' own options --------------------------------------------------------------------
option_texts = st.one_of(st.sampled_from(ODD_TEXTS), st.integers(-2 ** 70, 2 ** 70).map(str),
                         st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=12))


@settings(max_examples=LONG_RUN // 10 or 60, derandomize=not LONG_RUN, deadline=None, database=None)
@given(st.sampled_from(['-np', '--workers-per-node', '--memory-per-node', '--gpu-memory']), option_texts,
       override_cases())
def test_plan_takes_generated_options_or_says_one_line(option, text, case):
    """Test that tools.plan with a generated value of one of its options and one generated
    override prints its plan (exit 0, or 2 when it does not fit) or one `error:` line (exit 2);
    never a traceback."""
    from sample_fc.tools import plan
    dataset, network, loss, key, value = case
    argv = ['--dataset', dataset, '-np', '2', '--set', f'{key}={value}', option, text]
    code, out, err = _run_main(plan.main, argv)
    assert 'Traceback' not in err
    if code in (0, None) or (code == 2 and 'does NOT fit' in out and not err.strip()):   # a plan, or a plan refused
        return
    errors = [line for line in err.splitlines() if 'error:' in line]      # (argparse's usage lines before)
    assert code == 2 and len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], (argv, code, err)


def test_print_config_into_a_reader_that_stops_early_ends_quietly():
    """Test that `train.py --print-config | true` (a reader gone before the config is printed, as
    `| head -1` may be) exits 0 without a traceback, and that `| head -1` gets the first line."""
    import subprocess
    for reader, first in (("true", ""), ("head -1", "{\n")):
        result = subprocess.run(f"{sys.executable} train.py --print-config --set lr=0.3 | {reader}; "
                                "exit ${PIPESTATUS[0]}", shell=True, executable="/bin/bash", cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert result.stdout == first
        assert result.returncode == 0, result.stderr
        assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr
