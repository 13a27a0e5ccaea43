"""The configuration's home: what a run is configured by, free of MXNet.

    key_types.py   the declared types (Flag, Int, Real, Text, Choice, ListOf) and `key=value` overrides
    keys.py        the key table: every key once, its type, default and meaning in one line
    presets.py     datasets (the built-in ones and the card's, default.py), published margins, as data
    resolve.py     a run's config: presets in order, overrides, a saved run's config, the checks across keys
    older_runs.py  reading an older run: the keys a resume may change, keys added or renamed since
    rules.py       training rules read from a config (the lr a part trains with, a share of the steps)
    files.py       config.json written atomically and read back; its lines for the log

    from sample_fc import config
    cfg = config.config_for_run('demo', overrides=['lr=0.2'])
"""
from .files import format_config, json_text, load_config, save_config, write_json, write_text
from .key_types import (Choice, Flag, Int, KeyTable, KeyType, ListOf, Real, Text, apply_overrides, defaults,
                        parse_override)
from .keys import KEYS
from .older_runs import RENAMED_KEYS, RESUME_MUTABLE, VALUE_BEFORE_KEY, overridden_keys, renamed_overrides
from .presets import DATASETS, LOSSES, NETWORKS
from .resolve import base_config, check_config, config_for_run, config_from_checkpoint, default_network, get_config
from .rules import LR_REFERENCE_BATCH, bank_setting, scaled_lr, steps_of
