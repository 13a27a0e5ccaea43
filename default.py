"""Your card: the datasets you train, by name, beside sample_fc's built-in presets.

    python train.py --dataset my_faces --network r100 --loss arcface

A set of your own is one entry of DATASET_PRESETS below: the config keys it sets (any key of
the key table, sample_fc/config/keys.py, which docs/training.md's "Key reference" explains),
each converted and checked by its declared type as every preset is. Under the name of a
built-in preset (demo, custom, webface, emore, glint360k, synthetic_1m, synthetic_10m:
sample_fc/config/presets.py) the keys given change that preset's, e.g. {'emore': {'rec': PATH}}.
For one experiment's differences keep a small file instead (`train.py --config my_exp.cfg`);
for one run, `--set key=value`.

The configuration itself is the package's, sample_fc.config (it reads this card); the names it
offers (get_config, config_for_run, check_config, KEYS, DATASETS, ...) are read here too, for
scripts that import them from the card:

    from default import get_config
    cfg = get_config(dataset='emore', network='r100', loss='arcface')

This file imports nothing when loaded (no mxnet).
"""

DATASET_PRESETS = {
    # 'my_faces': {
    #     'rec': '/data/my_faces/train.rec',    # train.idx and property beside it (python -m sample_fc.tools.pack)
    #     'num_classes': 93431,                 # identities (the property file says it too)
    #     'image_size': 112,                    # aligned 112x112 crops
    #     'val_targets': ['lfw', 'cfp_fp'],     # NAME.bin beside train.rec (python -m sample_fc.tools.make_bin)
    #     'lr_steps': [40000, 60000],           # lr x 0.1 at these steps ...
    #     'max_update': 70000,                  # ... of this many
    # },
}


def __getattr__(name):
    """The configuration package's names (get_config, config_for_run, KEYS, ...), read on use."""
    import sample_fc.config
    return getattr(sample_fc.config, name)
