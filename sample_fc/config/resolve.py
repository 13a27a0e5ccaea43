"""A run's config: the declared defaults, then the presets in order (network, dataset, the
network family's recipe, loss), then `key=value` overrides; or a saved run's config read again
(older_runs.py's rules) with the keys a resume may change; and the checks across keys.

    from sample_fc import config
    cfg = config.get_config(dataset='emore', network='r100', loss='arcface')

`get_config` builds a fresh config each call: the declared defaults, then the network preset,
then the dataset preset, then the network family's training recipe (symbols/catalog.py: the
ViTs' AdamW; the dataset's SGD recipe moves to the bank), then the loss preset when one is named
(later presets win; only the demo dataset overlaps a network preset, shrinking the batch for
CPU). Without a named loss the dataset's own recipe stands: the base's ArcFace, or the demo's
CosFace m=0.25. A loss preset sets the published margins only; the scale s is the dataset's (64
as published for 10^4-10^7 identities; 32 for the demo's 200). A dataset may add its own recipe
for a named loss (presets.DATASET_LOSS_RECIPES: the demo warms ArcFace's lr up). Call
`check_config` after overrides. The presets are chosen by name, so pass them to `get_config`
rather than overriding `dataset=...`, which would only rename the run.
"""
import copy

from ..symbols import catalog
from ..errors import UsageError
from ..pfc.margin import margin_key_problem
from .key_types import apply_overrides, defaults
from .keys import KEYS
from .older_runs import VALUE_BEFORE_KEY, current_name, renamed_overrides, resume_changes
from .presets import DATASET_LOSS_RECIPES, DATASET_NETWORKS, DATASET_PRESETS, LOSS_PRESETS, NETWORK_PRESETS
from .rules import steps_of


def base_config():
    """A new config of every key at its declared default."""
    return defaults(KEYS)


def _apply_preset(cfg, kind, name, presets):
    """Copy preset `name` of `presets` into cfg; the preset may only change declared keys,
    to values their declared types take."""
    if name not in presets:
        raise UsageError(f"unknown {kind} preset {name!r}; choose one of: {', '.join(presets)}")
    for key, value in presets[name].items():
        if key not in cfg:
            raise UsageError(f"{kind} preset {name!r} sets {key!r}, which the base config lacks")
        try:
            cfg[key] = copy.deepcopy(KEYS[key].accept(key, value))   # presets are shared: no aliases
        except UsageError as err:
            raise UsageError(f"{kind} preset {name!r}: {err}") from None


def default_network(dataset):
    """The network preset `dataset` trains when none is named."""
    return DATASET_NETWORKS.get(dataset, base_config().network)


def get_config(dataset='demo', network=None, loss=None):
    """Return a new config for the given presets.

    Args:
        dataset: one of DATASETS.
        network: one of NETWORKS, or None for the dataset's (default_network).
        loss: one of LOSSES (its published margins), or None for the dataset's own recipe.
    Raises:
        UsageError: an unknown preset name (the message lists the choices).
    """
    cfg = base_config()
    network = network or default_network(dataset)
    _apply_preset(cfg, 'network', network, NETWORK_PRESETS)
    _apply_preset(cfg, 'dataset', dataset, DATASET_PRESETS)
    _apply_family_recipe(cfg, network, dataset)
    if loss is not None:
        _apply_preset(cfg, 'loss', loss, LOSS_PRESETS)
        cfg.loss = loss                  # the chosen presets, recorded in config.json
        if (dataset, loss) in DATASET_LOSS_RECIPES:
            _apply_preset(cfg, 'dataset recipe for loss', (dataset, loss), DATASET_LOSS_RECIPES)
    cfg.network = network                # (see above)
    cfg.dataset = dataset                # (see above)
    check_config(cfg, data=False)        # the custom preset names no data: --set rec= does
    return cfg


def _apply_family_recipe(cfg, network, dataset):
    """The training recipe of `network`'s family (catalog.FAMILY_RECIPES), if it has one, on a
    config that has its dataset preset: the dataset's SGD lr and weight decay move to the bank
    (bank_lr, bank_wd); the family's margin where the dataset has no margin of its own."""
    recipe = catalog.recipe(network)
    if recipe is None:
        return
    cfg.bank_lr, cfg.bank_wd = cfg.lr, cfg.wd              # the dataset's SGD recipe, for the centers
    _apply_preset(cfg, 'network recipe', network, {network: recipe['keys']})
    if 'loss' not in DATASET_PRESETS[dataset]:
        _apply_preset(cfg, 'loss', recipe['margin_loss'], LOSS_PRESETS)
        cfg.loss = recipe['margin_loss']                   # recorded as a named loss preset is


def config_from_checkpoint(saved, note=lambda line: None):
    """The config of a saved run (the `config` of a checkpoint's state.json): the defaults of
    its presets for keys added since it was written (VALUE_BEFORE_KEY where the default would
    change how it trains), then every saved value (under its current name: RENAMED_KEYS).
    Raises UsageError for a preset name this version does not know."""
    if not isinstance(saved, dict):
        raise UsageError(f"the saved config is a {type(saved).__name__}, not a JSON object of config keys")
    saved = {current_name(key, note): value for key, value in saved.items()}
    presets = [None if saved.get(key) is None else KEYS[key].accept(key, saved[key])
               for key in ('dataset', 'network', 'loss')]
    cfg = get_config(*presets)
    for key in cfg:
        if key in saved:
            cfg[key] = KEYS[key].accept(key, copy.deepcopy(saved[key]))
        elif key in VALUE_BEFORE_KEY:
            cfg[key] = VALUE_BEFORE_KEY[key]
    return cfg


def config_for_run(dataset=None, network=None, loss=None, overrides=(), resumed=None, note=lambda line: None):
    """The config of a run from its command line: presets (the demo's by default) and
    `key=value` overrides; or, resuming, the run's saved config (`resumed`: the `config` of
    its checkpoint), which presets and overrides may change only in RESUME_MUTABLE keys.
    note(line) is told of old key names read (RENAMED_KEYS). Raises UsageError naming the
    bad key or value."""
    overrides = renamed_overrides(overrides, note)
    for text in overrides:
        if text.split('=', 1)[0].strip() in ('dataset', 'network', 'loss'):
            raise UsageError(f"--set {text}: choose presets with --dataset/--network/--loss instead")
    if resumed is None:
        dataset = dataset or 'demo'
        cfg = get_config(dataset, network, loss)
    else:
        try:
            saved = config_from_checkpoint(resumed, note)
        except UsageError as err:
            raise UsageError(f"the saved config of the run being resumed: {err}") from None
        cfg = copy.deepcopy(saved)
        cfg.update({key: value for key, value in (('dataset', dataset), ('network', network),
                                                  ('loss', loss)) if value is not None})
    apply_overrides(cfg, overrides, KEYS)
    if resumed is not None:
        resume_changes(saved, cfg)
    check_config(cfg, data=resumed is not None)   # a new run's data: once the property file is read
    return cfg


def _fail(key, value, expected):
    raise UsageError(f"config key {key!r} is {value!r}; expected {expected}")


def check_config(cfg, data=True):
    """Check every key against its declared type (KEYS: kind, range, words), then what one
    key alone cannot say: the warm-up against the run's length; with `data`, that the config
    names its data (rec, num_classes: the custom preset leaves them to --set and the
    property file).

    Call after applying overrides. Raises UsageError naming the key, the bad value and
    what is allowed. World-size checks (num_classes >= workers) belong to train.py.
    """
    unknown = sorted(set(cfg) - set(KEYS))
    if unknown:
        raise UsageError(f"unknown config key {unknown[0]!r}")
    for key, kind in KEYS.items():
        if key not in cfg:
            raise UsageError(f"config key {key!r} is missing")
        kind.accept(key, cfg[key])
    if data and not cfg.synthetic and not cfg.rec:
        _fail('rec', cfg.rec, "a path to train.rec (or synthetic=true)" + (
            "; dataset custom trains your own set: --set rec=DIR/train.rec (python -m sample_fc.tools.pack "
            "--images FOLDER --out DIR/train makes one)" if cfg.dataset == 'custom' else ""))
    if data and cfg.num_classes < 1:
        _fail('num_classes', cfg.num_classes, "an integer >= 1 (train.py reads it from the property file beside rec)")
    problem = margin_key_problem(cfg.loss_margin, cfg)
    if problem:
        _fail(*problem)
    if cfg.lr_schedule != 'step' and steps_of(cfg.warmup_steps, cfg.max_update) >= cfg.max_update:
        _fail('warmup_steps', cfg.warmup_steps,
              f"fewer than max_update={cfg.max_update} for lr_schedule={cfg.lr_schedule}")
