"""Tests for the configuration package sample_fc/config/ (key table, presets, style, overrides,
save/load, older runs) and the card default.py that adds datasets to it."""
import ast
import importlib.util
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest
from easydict import EasyDict

from sample_fc.config import (Flag, Int, KeyTable, ListOf, Real, Text, apply_overrides, defaults,
                              format_config, load_config, parse_override, save_config)
from sample_fc.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PY = REPO / 'default.py'
CONFIG_DIR = REPO / 'sample_fc' / 'config'


import sample_fc.config as configuration  # noqa: E402
from sample_fc.config import keys as key_table, presets  # noqa: E402


# ---- presets ------------------------------------------------------------

def test_every_preset_combination_builds_with_the_base_keys():
    """Test that every dataset x network x loss combination builds, records its preset
    names, and has exactly the declared keys, each holding a value its declared type takes
    (a float where a number goes, even when the preset wrote an integer)."""
    base = configuration.base_config()
    combos = list(itertools.product(configuration.DATASETS, configuration.NETWORKS, configuration.LOSSES))
    assert len(combos) == 7 * 15 * 3
    for dataset, network, loss in combos:
        cfg = configuration.get_config(dataset=dataset, network=network, loss=loss)
        assert isinstance(cfg, EasyDict)
        assert list(cfg.keys()) == list(base.keys()), (dataset, network, loss)
        for key, kind in configuration.KEYS.items():      # or a word the key takes (sample_ratio=auto)
            assert kind.accept(key, cfg[key]) == cfg[key], (dataset, network, loss, key)
            number = float if isinstance(kind, Real) else type(base[key])     # bank_lr's default is a word
            assert type(cfg[key]) in (type(base[key]), number, str), (dataset, network, loss, key)
        assert (cfg.dataset, cfg.network, cfg.loss) == (dataset, network, loss)


PRESET_CONFIGS = REPO / 'tests' / 'data' / 'preset_configs.json'


def resolved_presets():
    """{'dataset/network/loss': config} of every preset combination, a network or loss None
    where the dataset's own is taken, as JSON reads it back."""
    combos = itertools.product(configuration.DATASETS, (None,) + configuration.NETWORKS, (None,) + configuration.LOSSES)
    return {f"{d}/{n}/{l}": json.loads(json.dumps(configuration.get_config(d, n, l))) for d, n, l in combos}


def test_every_preset_resolves_to_the_config_stored_before_the_configuration_moved():
    """Test that all 448 preset combinations (defaults included) resolve to exactly the configs
    stored from commit 9fc7e92, before the configuration left default.py (issue 78): every key's
    value equal, no key added or lost. A deliberate change to a preset rewrites the stored copy."""
    stored = json.loads(PRESET_CONFIGS.read_text())
    reference = stored['reference']
    expected = {name: {**reference, **changes} for name, changes in stored['presets'].items()}
    resolved = resolved_presets()
    assert len(resolved) == 7 * 16 * 4 and set(resolved) == set(expected)
    for name, cfg in resolved.items():
        assert cfg == expected[name], (name, {key: (cfg.get(key), expected[name].get(key))
                                              for key in set(cfg) | set(expected[name])
                                              if cfg.get(key) != expected[name].get(key)})


def test_preset_names_are_exposed():
    """Test that DATASETS, NETWORKS and LOSSES list the presets the brief requires."""
    assert configuration.DATASETS == ('demo', 'custom', 'webface', 'emore', 'glint360k',
                                'synthetic_1m', 'synthetic_10m')
    assert set(configuration.NETWORKS) == {'r18', 'r34', 'r50', 'r100', 'r200', 'mbf', 'mbf_large', 'mbf_small', 'vit_t',
                                     'vit_t_dp005_mask0', 'vit_s', 'vit_s_dp005_mask_0', 'vit_b', 'vit_b_dp005_mask_005',
                                     'vit_l_dp005_mask_005'}
    from sample_fc import symbols
    assert configuration.NETWORKS == symbols.NETWORKS     # a preset for every network, a network for every preset
    assert configuration.LOSSES == ('arcface', 'cosface', 'curricularface')


def test_margins_are_the_published_values_at_the_datasets_scale():
    """Test that arcface is (m1, m2, m3) = (1, 0.5, 0) and cosface (1, 0, 0.4) on any dataset,
    while the scale s stays the dataset's: the published 64 on emore, 32 on the demo."""
    def margins(cfg):
        return (cfg.loss_s, cfg.loss_m1, cfg.loss_m2, cfg.loss_m3)
    for dataset, s in (('demo', 32.0), ('emore', 64.0)):
        assert margins(configuration.get_config(dataset, loss='arcface')) == (s, 1.0, 0.5, 0.0)
        assert margins(configuration.get_config(dataset, loss='cosface')) == (s, 1.0, 0.0, 0.4)
    assert margins(configuration.get_config('emore')) == (64.0, 1.0, 0.5, 0.0)   # the base: ArcFace
    assert margins(configuration.get_config('demo')) == (32.0, 1.0, 0.0, 0.25)   # the demo's own CosFace


def test_the_demo_warms_arcface_up_and_nothing_else():
    """Test that `--loss arcface` on the demo brings the demo's warm-up for it (its margins
    still the published ones), that no other dataset or loss gets it, and that --set wins."""
    assert configuration.get_config('demo', loss='arcface').warmup_steps == 50
    assert configuration.get_config('demo', loss='arcface').loss_m2 == 0.5
    for dataset, loss in (('demo', None), ('demo', 'cosface'), ('emore', 'arcface'),
                          ('emore', None), ('glint360k', 'arcface'), ('webface', 'cosface')):
        assert configuration.get_config(dataset, loss=loss).warmup_steps == 0, (dataset, loss)
    cfg = configuration.config_for_run('demo', None, 'arcface', ['warmup_steps=0'])
    assert (cfg.loss, cfg.warmup_steps) == ('arcface', 0)


def test_a_vit_takes_arcface_torchs_recipe_and_leaves_the_datasets_sgd_to_the_bank():
    """Test that a ViT preset brings arcface_torch's ViT recipe on every dataset (AdamW at 1e-3,
    wd 0.1 on every parameter, poly after a warm-up over 10% of the run, CosFace 0.4 where the
    dataset names no margin of its own), the dataset's SGD lr and decay moving to bank_lr and
    bank_wd; that `--loss` and `--set` still win; and that the warm-up's share follows max_update
    (800 steps: 80 of warm-up in the schedule), where a count would have been refused."""
    from sample_fc.optimizers import schedule_of
    for dataset in configuration.DATASETS:
        plain, vit = configuration.get_config(dataset), configuration.get_config(dataset, 'vit_s')
        assert (vit.optimizer, vit.lr, vit.wd, vit.decay_all, vit.lr_schedule, vit.warmup_steps) == \
            ('adamw', 0.001, 0.1, True, 'poly', '10%'), dataset
        assert (vit.bank_lr, vit.bank_wd) == (plain.lr, plain.wd), dataset
        own_margin = dataset in ('demo', 'custom')
        assert (vit.loss_m2, vit.loss_m3) == ((plain.loss_m2, plain.loss_m3) if own_margin else (0.0, 0.4)), dataset
    assert configuration.get_config('emore', 'vit_t', 'arcface').loss_m2 == 0.5
    cfg = configuration.config_for_run('demo', 'vit_t', None, ['max_update=800', 'lr=0.002'])
    assert (cfg.lr, cfg.bank_lr, cfg.warmup_steps) == (0.002, 0.8, '10%')
    schedule = schedule_of(cfg, cfg.lr)
    assert schedule(40) == pytest.approx(0.001) and schedule(80) == pytest.approx(0.002) and schedule(800) == 0
    assert configuration.get_config('demo').optimizer == 'sgd' and configuration.get_config('demo').bank_lr == 'same'
    with pytest.raises(UsageError, match=r"config key 'warmup_steps' is '100%'; expected an integer .* N% \(0 <= N < 100\)"):
        configuration.config_for_run('demo', 'vit_t', None, ['warmup_steps=100%'])
    with pytest.raises(UsageError, match=r"config key 'warmup_steps' is 800"):
        configuration.config_for_run('demo', 'vit_t', None, ['max_update=800', 'warmup_steps=800'])


def test_dataset_presets_hold_the_dataset_facts():
    """Test that real and synthetic datasets carry their class counts, image counts and
    sample ratios, and that defaults are the documented ones."""
    facts = {'webface': (10572, 494414, 1.0, False), 'emore': (85742, 5822653, 1.0, False),
             'glint360k': (360232, 17091657, 0.1, False),
             'synthetic_1m': (1000000, 0, 0.1, True), 'synthetic_10m': (10000000, 0, 0.1, True)}
    for name, expected in facts.items():
        cfg = configuration.get_config(dataset=name)
        assert (cfg.num_classes, cfg.num_images, cfg.sample_ratio, cfg.synthetic) == expected
    demo = configuration.get_config()
    assert (demo.dataset, demo.network, demo.loss) == ('demo', 'mbf_small', 'cosface')
    assert configuration.get_config(dataset='emore').network == 'mbf'           # the field's mbf elsewhere
    assert configuration.get_config(dataset='demo', network='mbf').network == 'mbf'
    assert (demo.loss_s, demo.loss_m1, demo.loss_m2, demo.loss_m3) == (32.0, 1.0, 0.0, 0.25)
    assert configuration.get_config(dataset='emore').loss == 'arcface'
    assert demo.rec == 'data/demo/train.rec' and demo.val_targets == ['demo_val']
    assert demo.max_update <= 1000 and demo.lr_steps[-1] < demo.max_update
    assert (demo.context, demo.bank_context, demo.allgather) == ('auto', 'same', 'native')
    emore = configuration.get_config(dataset='emore')
    assert (emore.lr, emore.momentum, emore.wd, emore.lr_factor) == (0.1, 0.9, 5e-4, 0.1)
    assert (demo.max_nonfinite_steps, demo.collective_timeout_s) == (5, 60)


def test_get_config_returns_independent_copies():
    """Test that mutating one config (including its lists) does not leak into the next."""
    first = configuration.get_config(dataset='emore')
    first.lr_steps.append(999999)
    first.val_targets.append('x')
    first.lr = 7.0
    second = configuration.get_config(dataset='emore')
    assert second.lr_steps == [100000, 160000, 220000]
    assert 'x' not in second.val_targets and second.lr == 0.1


@pytest.mark.parametrize('kwargs, value', [({'dataset': 'ms1m'}, 'ms1m'),
                                           ({'network': 'r152'}, 'r152'),
                                           ({'loss': 'sphereface'}, 'sphereface')])
def test_unknown_preset_is_rejected_with_choices(kwargs, value):
    """Test that an unknown preset name raises ValueError naming it and the choices."""
    kind = next(iter(kwargs))
    choices = {'dataset': configuration.DATASETS, 'network': configuration.NETWORKS,
               'loss': configuration.LOSSES}[kind]
    with pytest.raises(ValueError) as info:
        configuration.get_config(**kwargs)
    message = str(info.value)
    assert repr(value) in message
    assert all(choice in message for choice in choices)


def test_preset_cannot_add_a_key_or_change_a_type(monkeypatch):
    """Test that a preset setting an undeclared key, or a value its declared type does not
    take, fails naming the preset and the key; an integer for a number is taken as a float."""
    monkeypatch.setitem(presets.LOSS_PRESETS, 'bad', {'loss_mm': 1.0})
    with pytest.raises(ValueError, match="'loss_mm'"):
        configuration.get_config(loss='bad')
    emore = presets.DATASET_PRESETS['emore']
    for value in ('64', [64.0], True, float('nan'), -1.0):
        monkeypatch.setitem(presets.DATASET_PRESETS, 'emore', dict(emore, loss_s=value))
        with pytest.raises(UsageError, match="dataset preset 'emore': config key 'loss_s' is "):
            configuration.get_config('emore')
    monkeypatch.setitem(presets.DATASET_PRESETS, 'emore', dict(emore, loss_s=64))
    assert type(configuration.get_config('emore').loss_s) is float


@pytest.mark.parametrize('override, key', [
    ('context=tpu', 'context'), ('bank_context=gpu', 'bank_context'),
    ('allgather=ring', 'allgather'), ('sample_ratio=0', 'sample_ratio'),
    ('sample_ratio=1.5', 'sample_ratio'), ('batch_size=0', 'batch_size'),
    ('lr_steps=300,200', 'lr_steps'), ('lr=-0.1', 'lr'),
    ('rec=', 'rec'), ('clip_grad_norm=-1', 'clip_grad_norm'), ('clip_grad_norm=nan', 'clip_grad_norm'),
    ('backbone_init=kaiming', 'backbone_init'), ('image_size=100', 'image_size')])
def test_check_config_rejects_bad_values(override, key):
    """Test that a bad `--set` value is refused in one line naming the key, the value and what
    the key takes, whether its declared type (config_for_run) or check_config finds it."""
    with pytest.raises(UsageError) as info:
        configuration.check_config(configuration.config_for_run(overrides=[override]))
    message = str(info.value)
    assert message.startswith(f"config key {key!r} is ") and "; expected " in message and "\n" not in message
    assert override.split('=', 1)[1] in message


def test_check_config_checks_every_key_against_its_declared_type():
    """Test that check_config refuses a config whose value was set past the readers (by code):
    a wrong kind, a value out of range, a missing or unknown key."""
    for key, value in (('lr', 'fast'), ('batch_size', 2.0), ('fp16', 1), ('lr_steps', [2, 1]),
                       ('momentum', 1.5), ('val_targets', 'lfw'), ('seed', -1)):
        cfg = configuration.get_config()
        cfg[key] = value
        with pytest.raises(UsageError, match=re.escape(f"config key '{key}' is {value!r}; expected")):
            configuration.check_config(cfg)
    cfg = configuration.get_config()
    del cfg['lr']
    with pytest.raises(UsageError, match="'lr' is missing"):
        configuration.check_config(cfg)
    cfg = configuration.get_config()
    cfg['lrr'] = 0.1
    with pytest.raises(UsageError, match="unknown config key 'lrr'"):
        configuration.check_config(cfg)


# ---- the key table and presets: style; the card ----------------------------------------------------

def _comment_lines(source):
    """Return (lines holding any comment, lines holding only a comment)."""
    any_comment, only_comment = set(), set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            any_comment.add(row)
            if not tok.line[:tok.start[1]].strip():
                only_comment.add(row)
    return any_comment, only_comment


def _key_assignments(tree, keys):
    """Yield (key, first line, last line) for every place default.py sets a config key:
    `x.key = ...`, `x['key'] = ...`, and `'key': ...` entries of dict literals."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr in keys:
                    yield target.attr, node.lineno, node.end_lineno
                elif (isinstance(target, ast.Subscript)
                      and isinstance(target.slice, ast.Constant)
                      and target.slice.value in keys):
                    yield target.slice.value, node.lineno, node.end_lineno
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value in keys:
                    yield k.value, k.lineno, v.end_lineno


def test_every_key_assignment_of_the_table_and_presets_is_commented():
    """Test that every assignment to a config key in the key table (keys.py) and the presets
    (presets.py) carries a trailing comment or sits right below a comment line, that every base
    key is declared in the table, and that the table's lines keep within 120 characters."""
    keys = set(configuration.base_config())
    found = {}
    for name in ('keys.py', 'presets.py'):
        source = (CONFIG_DIR / name).read_text()
        any_comment, only_comment = _comment_lines(source)
        found[name] = list(_key_assignments(ast.parse(source), keys))
        uncommented = [(key, first) for key, first, last in found[name]
                       if not (any_comment & set(range(first, last + 1)) or first - 1 in only_comment)]
        assert uncommented == [], f"{name}: config keys set without a comment (key, line): {uncommented}"
        assert max(len(line) for line in source.splitlines()) <= 120, name
    assert [key for key, _, _ in found['keys.py']] == list(configuration.KEYS)
    # Every preset entry counts: 14 + 5 x 10 dataset keys, 3 x 4 loss keys.
    assert len(found['presets.py']) >= 64 + 12
    assert len((CONFIG_DIR / 'keys.py').read_text().splitlines()) < 150


def test_comment_checker_catches_a_missing_comment():
    """Test that the comment check above flags an uncommented assignment (guards the guard)."""
    source = "cfg = {}\n# fine\ncfg.lr = 0.1\ncfg.wd = 5e-4\nx = {'lr': 1,  # ok\n 'wd': 2}\n"
    any_comment, only_comment = _comment_lines(source)
    found = list(_key_assignments(ast.parse(source), {'lr', 'wd'}))
    bad = [(key, first) for key, first, last in found
           if not (any_comment & set(range(first, last + 1)) or first - 1 in only_comment)]
    assert sorted(bad) == [('wd', 4), ('wd', 6)]


def test_the_key_reference_names_every_key_in_order():
    """Test that docs/training.md's "Key reference" has one list item per config key, in the
    order of the key table (sample_fc/config/keys.py), so a key added without its entry (or out of order) fails."""
    text = (REPO / 'docs' / 'training.md').read_text()
    assert '\n## Key reference\n' in text
    section = text.split('\n## Key reference\n', 1)[1].split('\n## ', 1)[0]
    documented = re.findall(r'^- `(\w+)`', section, flags=re.M)
    assert documented == list(configuration.KEYS)
    assert len(documented) == len(set(documented))


def test_importing_default_does_not_import_mxnet():
    """Test that importing the card default.py and building a config through it loads neither
    mxnet nor horovod."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import default; "
            "default.get_config('glint360k', 'r100', 'cosface'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mxnet', 'horovod')))")
    result = subprocess.run([sys.executable, '-c', code, str(REPO)], capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '[]'


# ---- sample_fc/config.py: overrides -----------------------------------------------------

def _keys():
    """A small table of declared keys, one of each kind."""
    table = KeyTable()
    table.lr = Real(0.1, lo=0, lo_open=True)                          # a number > 0
    table.batch_size = Int(64, lo=1)                                  # an integer >= 1
    table.fp16 = Flag(False)                                          # a flag
    table.rec = Text('a.rec')                                         # any string
    table.lr_steps = ListOf([10, 20], Int(1, lo=1), increasing=True)  # increasing integers
    table.val_targets = ListOf(['lfw'], Text(''))                     # strings
    table.ratios = ListOf([0.5], Real(0.5, lo=0))                     # numbers
    table.sample_ratio = Real(1.0, lo=0, lo_open=True, hi=1, words=('auto',))   # or a word
    table.momentum = Real(0.9, lo=0, hi=1, hi_open=True)              # a number in [0, 1)
    return vars(table)


def _cfg():
    return defaults(_keys())


def _override(cfg, texts):
    return apply_overrides(cfg, texts, _keys())


def test_parse_override_splits_at_the_first_equals():
    """Test that parse_override returns (key, raw) split at the first '='."""
    assert parse_override('lr=0.1') == ('lr', '0.1')
    assert parse_override('rec=a=b.rec') == ('rec', 'a=b.rec')
    assert parse_override('rec=') == ('rec', '')


@pytest.mark.parametrize('text', ['lr', 'lr 0.1', '=0.1', ''])
def test_malformed_override_is_rejected(text):
    """Test that an override without '=' or without a key raises ValueError naming it."""
    with pytest.raises(ValueError, match='malformed override') as info:
        parse_override(text)
    assert repr(text) in str(info.value)
    with pytest.raises(ValueError, match='malformed override'):
        _override(_cfg(), [text])


def test_scalar_overrides_are_converted_to_the_declared_type():
    """Test that int, float, bool and str overrides get the key's declared type."""
    cfg = _override(_cfg(), ['batch_size=100000', 'lr=1', 'fp16=TRUE', 'rec=b c.rec'])
    assert cfg.batch_size == 100000 and type(cfg.batch_size) is int
    assert cfg.lr == 1.0 and type(cfg.lr) is float
    assert cfg.fp16 is True
    assert cfg.rec == 'b c.rec' and cfg['rec'] == 'b c.rec'
    for text, value in [('yes', True), ('no', False), ('1', True), ('0', False),
                        ('False', False), ('True', True)]:
        assert _override(_cfg(), [f'fp16={text}']).fp16 is value
    assert _override(_cfg(), ['lr=2.5e-3']).lr == 2.5e-3


def test_list_overrides_accept_json_and_commas():
    """Test that lists parse from JSON or comma text, each element of the declared item type."""
    assert _override(_cfg(), ['lr_steps=[1, 2, 3]']).lr_steps == [1, 2, 3]
    assert _override(_cfg(), ['lr_steps=100,200']).lr_steps == [100, 200]
    assert _override(_cfg(), ['lr_steps=']).lr_steps == []
    assert _override(_cfg(), ['lr_steps=[]']).lr_steps == []
    assert _override(_cfg(), ['val_targets=lfw, cfp_fp']).val_targets == ['lfw', 'cfp_fp']
    assert _override(_cfg(), ['val_targets=["agedb_30"]']).val_targets == ['agedb_30']
    # ["lfw", "cfp_fp"] typed unquoted in bash arrives as [lfw, cfp_fp]: the same list
    assert _override(_cfg(), ['val_targets=[lfw, cfp_fp]']).val_targets == ['lfw', 'cfp_fp']
    assert _override(_cfg(), ['val_targets=[glyphs_val]']).val_targets == ['glyphs_val']
    ratios = _override(_cfg(), ['ratios=1,0.25']).ratios
    assert ratios == [1.0, 0.25] and all(type(r) is float for r in ratios)
    assert _override(_cfg(), ['ratios=[2, 0.5]']).ratios == [2.0, 0.5]


def test_words_and_atomic_overrides():
    """Test that a key's declared words are taken (any case) beside its values, whatever the
    key holds now (the custom preset's sample_ratio=auto took no number before), and that a
    failing batch of overrides leaves the config unchanged."""
    cfg = _override(_cfg(), ['sample_ratio=auto'])
    assert cfg.sample_ratio == 'auto'
    assert _override(cfg, ['sample_ratio=0.5']).sample_ratio == 0.5
    assert _override(cfg, ['sample_ratio= AUTO ']).sample_ratio == 'auto'
    cfg = _cfg()
    with pytest.raises(ValueError):
        _override(cfg, ['lr=0.5', 'batch_size=big'])
    assert cfg == _cfg()


@pytest.mark.parametrize('override, typename', [
    ('batch_size=0.5', 'integer'), ('batch_size=1e3', 'integer'), ('batch_size=0', 'integer >= 1'),
    ('batch_size=' + '9' * 5000, 'integer'), ('lr=fast', 'number'), ('lr=0', 'number > 0'),
    ('lr=inf', 'finite'), ('lr=nan', 'finite'), ('fp16=maybe', 'true or false'), ('fp16=', 'true or false'),
    ('lr_steps=10,x', 'each an integer'), ('lr_steps=[1.5]', 'each an integer'), ('lr_steps=[1,', 'list'),
    ('lr_steps={"a": 1}', 'list'), ('lr_steps=' + '[' * 100000, 'list'),
    ('lr_steps=20,10', 'strictly increasing'), ('val_targets=[1]', 'each a string'),
    ('val_targets=[a, [b]', 'list'), ('lr_steps=[x]', 'each an integer'),
    ('momentum=x', 'number'), ('momentum=1', '[0, 1)'), ('sample_ratio=automatic', 'or auto'),
    ('momentum=1e-320', "float32's smallest"), ('lr=-1e-39', 'number > 0')])
def test_wrong_type_names_key_value_and_type(override, typename):
    """Test that a value of the wrong kind or range raises one UsageError line naming the key,
    the value as typed and what the key takes."""
    key, raw = override.split('=', 1)
    with pytest.raises(UsageError) as info:
        _override(_cfg(), [override])
    message = str(info.value)
    assert message.startswith(f"config key {key!r} is {repr(raw)[:100]}") and typename in message
    assert '\n' not in message


def test_unknown_key_suggests_the_close_one():
    """Test that an unknown key is named with a difflib suggestion, or the valid keys."""
    with pytest.raises(ValueError) as info:
        _override(_cfg(), ['lrr=0.1'])
    assert str(info.value) == "unknown config key 'lrr'; did you mean 'lr'?"
    with pytest.raises(ValueError, match=r"did you mean 'momentum'\?"):
        _override(_cfg(), ['momentun=0.1'])
    with pytest.raises(ValueError) as info:
        _override(_cfg(), ['zzzzzz=1'])
    assert "'zzzzzz'" in str(info.value) and 'valid keys:' in str(info.value)
    assert 'batch_size' in str(info.value) and 'sample_ratio' in str(info.value)


def test_overrides_work_on_the_real_config():
    """Test that overrides apply to a default.py config and keep it valid."""
    cfg = apply_overrides(configuration.get_config(dataset='emore', network='r50'),
                          ['lr_steps=1000,2000', 'max_update=3000', 'context=cpu',
                           'val_targets=lfw'], configuration.KEYS)
    assert cfg.lr_steps == [1000, 2000] and cfg.max_update == 3000
    assert cfg.context == 'cpu' and cfg.val_targets == ['lfw']
    configuration.check_config(cfg)
    with pytest.raises(ValueError, match="did you mean 'lr'"):
        apply_overrides(cfg, ['lrr=0.2'], configuration.KEYS)


# ---- sample_fc/config.py: save, load, format -----------------------------------------------

def test_save_and_load_round_trip(tmp_path):
    """Test that save_config writes sorted, indented JSON that load_config reads back equal,
    replacing an existing file and leaving no temporary file behind."""
    path = tmp_path / 'config.json'
    path.write_text('stale')
    for dataset in configuration.DATASETS:
        cfg = configuration.get_config(dataset=dataset, network='r100', loss='cosface')
        save_config(cfg, path)
        text = path.read_text()
        data = json.loads(text)
        assert list(data) == sorted(cfg)
        assert text == json.dumps(data, sort_keys=True, indent=2) + '\n'
        loaded = load_config(path)
        assert isinstance(loaded, EasyDict) and loaded == cfg
        assert loaded.lr_steps == cfg.lr_steps and loaded.wd == cfg.wd
    save_config(_cfg(), str(path))
    assert load_config(path) == _cfg()
    assert [p.name for p in tmp_path.iterdir()] == ['config.json']


def test_save_config_failure_keeps_the_old_file(tmp_path):
    """Test that a config that is not JSON-serialisable leaves the previous file intact."""
    path = tmp_path / 'config.json'
    save_config({'lr': 0.1}, path)
    with pytest.raises(TypeError):
        save_config({'lr': object()}, path)
    assert load_config(path) == {'lr': 0.1}
    assert [p.name for p in tmp_path.iterdir()] == ['config.json']


def test_format_config_lists_every_key():
    """Test that format_config prints one aligned "key: value" line per leaf key."""
    text = format_config(_cfg())
    lines = text.splitlines()
    assert len(lines) == 9
    assert lines[0].split() == ['lr:', '0.1']
    assert "rec: 'a.rec'" in [' '.join(line.split()) for line in lines]
    assert len({line.index(line.split()[1]) for line in lines}) == 1  # values aligned
    cfg = configuration.get_config()
    assert len(format_config(cfg).splitlines()) == len(cfg)


def test_demo_preset_matches_the_demo_data_generator():
    """Test that the demo preset's class count, image size and image count are what
    `python -m sample_fc.tools.demo_data` writes by default (so ./horovodrun.sh needs no flags)."""
    import inspect
    from sample_fc.tools.demo_data import make_demo
    defaults = {k: p.default for k, p in inspect.signature(make_demo).parameters.items()}
    demo = configuration.get_config()
    assert demo.num_classes == defaults['num_identities']
    assert demo.image_size == defaults['image_size']
    assert demo.num_images == defaults['num_identities'] * defaults['images_per_identity']


# ---- a run's config, fresh or resumed ------------------------------------

def _saved_run():
    """A run's saved config as a checkpoint's state.json holds it (JSON round trip)."""
    cfg = configuration.config_for_run('emore', 'r50', 'cosface', ['loss_s=30', 'max_update=100'])
    return json.loads(json.dumps(cfg))


def test_config_for_run_fresh_applies_presets_then_overrides():
    """Test that a fresh run is get_config's presets (demo by default) plus the overrides."""
    assert configuration.config_for_run() == configuration.get_config()
    cfg = configuration.config_for_run('emore', 'r50', 'cosface', ['loss_s=30'])
    expected = configuration.get_config('emore', 'r50', 'cosface')
    expected.loss_s = 30.0
    assert cfg == expected
    with pytest.raises(ValueError, match="--set network=r18: choose presets"):
        configuration.config_for_run(overrides=['network=r18'])


def test_config_for_run_resumed_keeps_the_saved_config():
    """Test that resuming yields the saved config exactly (not the presets' values), with
    keys missing from an older checkpoint filled from its presets, and allowed changes applied."""
    saved = _saved_run()
    assert configuration.config_for_run(resumed=saved) == saved
    older = {k: v for k, v in saved.items() if k != 'head_kernel'}
    assert configuration.config_for_run(resumed=older) == saved          # head_kernel from the presets
    cfg = configuration.config_for_run('emore', 'r50', 'cosface', ['max_update=200', 'lr_steps=150'], resumed=saved)
    assert (cfg.max_update, cfg.lr_steps, cfg.loss_s) == (200, [150], 30.0)


def test_a_run_saved_before_gradient_clipping_resumes_without_it():
    """Test that a checkpoint whose config predates clip_grad_norm, backbone_init and
    momentum_form resumes with no clipping, the Xavier init and MXNet's momentum it trained
    with, not the new defaults, so its loss goes on as before; a checkpoint that has the keys
    keeps its values."""
    saved = _saved_run()
    new_keys = ('clip_grad_norm', 'backbone_init', 'momentum_form')
    assert [saved[k] for k in new_keys] == [5.0, 'arcface_torch', 'pytorch']   # the defaults
    older = {k: v for k, v in saved.items() if k not in new_keys}
    cfg = configuration.config_for_run(resumed=older)
    assert [cfg[k] for k in new_keys] == [0.0, 'xavier', 'mxnet']
    assert {k: v for k, v in cfg.items() if k not in new_keys} == older
    assert configuration.config_for_run(resumed=dict(saved, clip_grad_norm=2.5)).clip_grad_norm == 2.5


def test_a_run_saved_before_the_sampling_warmup_resumes_without_it():
    """Test that a checkpoint whose config predates sample_ratio_warmup_steps resumes sampling
    at its sample_ratio from the next step (0 warm-up steps), not with the new default of 200,
    while a new run of the same presets gets the default."""
    saved = dict(_saved_run(), sample_ratio=0.1)
    assert configuration.get_config('emore', 'r50', 'cosface').sample_ratio_warmup_steps == 200
    older = {k: v for k, v in saved.items() if k != 'sample_ratio_warmup_steps'}
    assert configuration.config_for_run(resumed=older).sample_ratio_warmup_steps == 0
    assert configuration.config_for_run(resumed=saved).sample_ratio_warmup_steps == 200
    assert configuration.get_config('synthetic_1m').sample_ratio_warmup_steps == 0


@pytest.mark.parametrize("key", ["sample_correction", "sample_wd_correction"])
def test_a_run_saved_before_a_sampling_correction_resumes_without_it(key):
    """Test that a checkpoint whose config predates sample_correction (or sample_wd_correction)
    resumes with the sampled softmax it trained with (no correction), whatever today's default,
    and that a saved value stands."""
    saved = dict(_saved_run(), sample_ratio=0.1)
    older = {k: v for k, v in saved.items() if k != key}
    assert configuration.config_for_run(resumed=older)[key] is False
    for value in (True, False):
        assert configuration.config_for_run(resumed=dict(saved, **{key: value}))[key] is value


def test_bank_dtype_is_checked_and_fixed_on_resume():
    """Test that bank_dtype takes float32 or float16 only, and that resuming a run into the
    other dtype is refused in one line naming both values (the run's shards keep their dtype)."""
    assert configuration.get_config().bank_dtype == 'float32'
    assert configuration.config_for_run(overrides=['bank_dtype=float16']).bank_dtype == 'float16'
    with pytest.raises(ValueError, match="'bank_dtype' is 'bfloat16'; expected one of: float32, float16"):
        configuration.config_for_run(overrides=['bank_dtype=bfloat16'])
    with pytest.raises(ValueError, match="bank_dtype='float16' would change the run being resumed, which has "
                                         "bank_dtype='float32'"):
        configuration.config_for_run(overrides=['bank_dtype=float16'], resumed=_saved_run())


def test_bank_momentum_is_checked_fixed_on_resume_and_same_for_older_runs():
    """Test that bank_momentum takes auto, same, int8 or none only; that resuming a run with another
    momentum storage is refused in one line naming both values (its shards hold that storage);
    and that a run saved before the key resumes with its momentum stored as the weights."""
    assert configuration.get_config().bank_momentum == 'same'
    for value in ('int8', 'none'):
        assert configuration.config_for_run(overrides=[f'bank_momentum={value}']).bank_momentum == value
    with pytest.raises(ValueError, match="'bank_momentum' is 'int4'; expected one of: auto, same, int8, none"):
        configuration.config_for_run(overrides=['bank_momentum=int4'])
    saved = dict(_saved_run(), bank_momentum='int8')
    assert configuration.config_for_run(resumed=saved, overrides=['max_update=200']).bank_momentum == 'int8'
    with pytest.raises(ValueError) as error:
        configuration.config_for_run(overrides=['bank_momentum=same'], resumed=saved)
    assert str(error.value).startswith("bank_momentum='same' would change the run being resumed, which has "
                                       "bank_momentum='int8'") and "\n" not in str(error.value)
    older = {k: v for k, v in _saved_run().items() if k != 'bank_momentum'}
    assert configuration.config_for_run(resumed=older).bank_momentum == 'same'
    with pytest.raises(ValueError, match="bank_momentum='int8' would change the run being resumed"):
        configuration.config_for_run(overrides=['bank_momentum=int8'], resumed=older)


def test_renamed_keys_are_read_under_their_new_names_with_a_note():
    """Test that a saved run's config with the old names sgd_momentum and verbose resumes with
    their values under momentum_form and verify_period, that `--set verbose=N` sets
    verify_period, that each old name read is said in one note naming both names, and that the
    resolved config holds only the new names."""
    saved = _saved_run()
    old = {('sgd_momentum' if k == 'momentum_form' else 'verbose' if k == 'verify_period' else k): v
           for k, v in dict(saved, momentum_form='mxnet', verify_period=17).items()}
    notes = []
    cfg = configuration.config_for_run(resumed=old, overrides=['verbose=40'], note=notes.append)
    assert (cfg.momentum_form, cfg.verify_period) == ('mxnet', 40)
    assert 'verbose' not in cfg and 'sgd_momentum' not in cfg
    assert notes.count("config key 'verbose' is now called 'verify_period'; read as 'verify_period'") == 2
    assert sum("'sgd_momentum' is now called 'momentum_form'" in line for line in notes) == 1
    fresh = configuration.config_for_run(overrides=['sgd_momentum=mxnet'])
    assert fresh.momentum_form == 'mxnet'
    with pytest.raises(ValueError, match="'momentum_form' is 'sgd'"):
        configuration.config_for_run(overrides=['sgd_momentum=sgd'])


@pytest.mark.parametrize("flags, overrides, message", [
    ({}, ['loss_s=64'], "loss_s=64.0 would change the run being resumed, which has loss_s=30.0"),
    ({'network': 'r100'}, [], "network='r100' would change the run being resumed, which has network='r50'"),
    ({}, ['rec=/elsewhere/train.rec'], "rec='/elsewhere/train.rec'"),
    ({}, ['embedding_size=128'], "embedding_size=128 would change"),
])
def test_config_for_run_resumed_refuses_changes_to_the_model_or_data(flags, overrides, message):
    """Test that changing a key outside RESUME_MUTABLE on resume names the key and both values."""
    with pytest.raises(ValueError) as error:
        configuration.config_for_run(overrides=overrides, resumed=_saved_run(), **flags)
    assert message in str(error.value)


def test_resume_mutable_keys_exist_and_exclude_the_model():
    """Test that every RESUME_MUTABLE key is a config key and none defines the model or data."""
    base = configuration.base_config()
    assert set(configuration.RESUME_MUTABLE) <= set(base)
    model_and_data = {'rec', 'num_classes', 'image_size', 'network', 'embedding_size', 'loss', 'loss_s',
                      'loss_m1', 'loss_m2', 'loss_m3', 'sample_ratio', 'batch_size', 'seed', 'dataset'}
    assert not model_and_data & set(configuration.RESUME_MUTABLE)


# ---- the card: the user's datasets ----------------------------------------------------------

CARD = '''
DATASET_PRESETS = {
    'my_faces': {'rec': '', 'synthetic': True, 'num_classes': 5000, 'image_size': 112,
                 'val_targets': [], 'max_update': 300, 'lr_steps': [200, 250]},
    'emore': {'rec': '/elsewhere/faces_emore/train.rec'},
}
'''


def _in_card_dir(tmp_path, card, code):
    """Run `code` in a Python whose working directory holds `card` as default.py (the user's
    card, first on the path), with the repository importable after it."""
    (tmp_path / 'default.py').write_text(card)
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, 'PYTHONPATH': str(REPO)})


def test_a_dataset_of_the_card_is_a_preset_of_the_package_and_of_tools_plan(tmp_path):
    """Test that a set in the card's DATASET_PRESETS is a dataset preset of sample_fc.config (on
    the built-in base, checked as every preset), that a built-in name there changes the built-in
    preset's keys it names, and that tools.plan, which imports only the package, plans the card's set."""
    code = ("import json; from sample_fc import config; "
            "mine = config.get_config('my_faces'); emore = config.get_config('emore'); "
            "print(json.dumps([config.DATASETS, mine.num_classes, mine.lr_steps, mine.loss, emore.rec, "
            "emore.num_classes]))")
    result = _in_card_dir(tmp_path, CARD, code)
    assert result.returncode == 0, result.stderr
    datasets, classes, lr_steps, loss, emore_rec, emore_classes = json.loads(result.stdout)
    assert datasets[-1] == 'my_faces' and 'demo' in datasets
    assert (classes, lr_steps, loss) == (5000, [200, 250], 'arcface')        # the base's loss
    assert (emore_rec, emore_classes) == ('/elsewhere/faces_emore/train.rec', 85742)
    plan = _in_card_dir(tmp_path, CARD, "import sys; from sample_fc.tools.plan import main; "
                        "sys.argv = ['plan', '--dataset', 'my_faces', '--network', 'mbf', '-np', '2']; main()")
    assert plan.returncode == 0, plan.stderr
    assert '5,000' in plan.stdout or '5000' in plan.stdout, plan.stdout


def test_a_card_value_its_key_does_not_take_is_one_line_naming_the_preset(tmp_path):
    """Test that a wrong value or an unknown key in the card's set is refused as any preset's is
    (naming the preset and the key), and a card whose DATASET_PRESETS is not a dict of dicts is
    refused naming DATASET_PRESETS."""
    for card, expected in [
            (CARD.replace("'num_classes': 5000", "'num_classes': -3"), "dataset preset 'my_faces': config key "
                                                                        "'num_classes' is -3"),
            (CARD.replace("'image_size': 112", "'image_sise': 112"), "dataset preset 'my_faces' sets 'image_sise'"),
            ("DATASET_PRESETS = ['my_faces']\n", "DATASET_PRESETS is not a dict")]:
        result = _in_card_dir(tmp_path, card, "from sample_fc.errors import UsageError\n"
                              "try:\n    from sample_fc import config\n    config.get_config('my_faces')\n"
                              "except UsageError as e:\n    print(e)\n")
        assert expected in (result.stdout + result.stderr), (card, result.stdout, result.stderr)


def test_a_card_that_does_not_load_is_one_line_and_exit_2(tmp_path):
    """Test that a card with a syntax error, or one whose import fails, stops train.py and the
    tools in one line naming the card and the error (exit 2, no traceback)."""
    said = "error: default.py, your card, does not load"
    for card, expected in [("DATASET_PRESETS = {'x': {'lr': 0.1}\n",
                            f"{said} (line 1): SyntaxError: '{{' was never closed"),
                           ("import no_such_module_here\n",
                            f"{said}: ModuleNotFoundError: No module named 'no_such_module_here'")]:
        for command in ("import sys; sys.argv = ['train.py', '--print-config']; "
                        f"sys.path.insert(1, {str(REPO)!r}); import runpy; runpy.run_path({str(REPO / 'train.py')!r}, "
                        "run_name='__main__')",
                        "from sample_fc.tools.plan import main; main(['-np', '2'])"):
            result = _in_card_dir(tmp_path, card, command)
            assert result.returncode == 2, result.stderr
            assert result.stderr.strip().splitlines() == [expected]
