"""The presets, as data: the built-in datasets with the card's own over them (the repository's
default.py: DATASET_PRESETS), the published margins (pfc/margin.py KINDS), the network a dataset
trains when none is named, and a dataset's recipe for a named loss. A network's preset and its
family's recipe are symbols/catalog.py's. Each value is checked by its key's declared type when a
preset is applied (resolve.get_config). Imports nothing heavy: no mxnet."""
import importlib
import importlib.util
import sys

from ..symbols import catalog
from ..errors import USAGE_EXIT, UsageError
from ..pfc.margin import loss_presets

CARD = 'default'        # the card's module: the repository's default.py (setup.py installs it beside the package)


# The network a dataset trains when none is named (others: the base's `network`). The demo
# keeps the paper's small MobileFaceNet to train in minutes on 2 CPU cores.
DATASET_NETWORKS = {
    'demo': catalog.CPU_NETWORK,
    'custom': catalog.CPU_NETWORK,
}

# Dataset presets. Schedules assume 8 workers; the step counts give about 20 epochs at a
# global batch of 512 (emore: 240000 * 512 / 5.8M images = 21 epochs).
BUILT_IN_DATASETS = {
    'demo': {
        'rec': 'data/demo/train.rec',    # built by `python -m sample_fc.tools.demo_data` (horovodrun.sh does it)
        'num_classes': 200,              # = sample_fc.tools.demo_data defaults (200 identities)
        'image_size': 32,                # = demo_data's default image size: trains in minutes on 2 CPU cores
        'num_images': 8000,              # 200 identities x 40 views
        'val_targets': ['demo_val'],     # data/demo/demo_val.bin, 600 pairs of held-out identities
        'synthetic': False,              # read rec
        'loss': 'cosface',               # the demo's recipe: CosFace m3=0.25; `--loss X` replaces
        'loss_s': 32.0,                  # the margins, not this scale (ArcFace m=0.5 at s=32: 0.925 in
        'loss_m2': 0.0,                  # 260 steps with the demo's ArcFace warm-up below; 0.84 at the
        'loss_m3': 0.25,                 # published s=64: BENCHMARKS.md, "Learning")
        'embedding_size': 128,           # small head for a small problem
        'sample_ratio': 1.0,             # small set: score every center
        'batch_size': 64,                # per worker
        'lr': 0.8,                       # for a global batch of 512, so 0.2 at 2 x 64 (measured best of 0.4/0.8)
        'warmup_steps': 0,               # no warm-up
        'data_threads': 1,               # 32 px JPEGs decode at ~3000/s per thread; leave the cores to training
        'lr_steps': [180, 230],          # decay twice near the end
        'max_update': 260,               # ~4 min on 2 CPU workers with mbf_small (~4 epochs): held-out 0.9217
                                         # (0.9133 with backbone_init=pytorch, seeds 1-5: 0.913 mean; 400 steps,
                                         # decay at 280, 350: 0.9233)
        'frequent': 20,                  # log often
        'verify_period': 130,            # verify halfway and at the end
        'ckpt_period': 130,              # checkpoint halfway and at the end
    },
    'custom': {                          # your own set: --dataset custom --set rec=DIR/train.rec
                                         # (tools.pack writes one)
        'rec': '',                       # required: the set's train.rec (train.idx and property beside it)
        'num_classes': 0,                # from the set's property file (train.py reads it), unless --set
        'val_targets': [],               # none: --set 'val_targets=["NAME"]' for NAME.bin beside train.rec
                                         # (tools.make_bin)
        'loss': 'cosface',               # the demo's small-set recipe: CosFace ...
        'loss_s': 32.0,                  # ... at s=32 (5,000 classes learned at it) ...
        'loss_m2': 0.0,                  # ... no angular margin ...
        'loss_m3': 0.25,                 # ... and a cosine margin of 0.25
        'embedding_size': 128,           # small head for a small set (512 for faces at scale)
        'batch_size': 64,                # per worker
        'lr': 0.1,                       # ... at the base's lr, not the demo's 0.8: on 5,000 real-image classes lr 0.8
                                         # sat at chance (0.52 held-out at step 400) where 0.1 learned (0.80;
                                         # BENCHMARKS.md, "A recipe for your own set")
        'sample_ratio': 'auto',          # the smallest ratio where sampling matched ratio 1.0 (docs/sampling.md,
                                         # "When to sample")
        'warmup_steps': 0,               # no lr warm-up (it did not help: BENCHMARKS.md)
        'max_update': 1000,              # set it for your set: 1000 steps x 128 images is ~2 epochs of 5,000 x 12
                                         # images
        'lr_steps': [700, 900],          # x0.1 at 70% and 90% of max_update: move them with it
        'frequent': 50,                  # log every 50 steps
        'verify_period': 500,            # verify (val_targets) halfway and at the end
        'ckpt_period': 500,              # checkpoint halfway and at the end
    },
    'webface': {
        'rec': 'data/faces_webface_112x112/train.rec',  # CASIA-WebFace, insightface's package
        'num_classes': 10572,            # identities in CASIA-WebFace
        'image_size': 112,               # aligned 112x112 crops
        'num_images': 494414,            # images in CASIA-WebFace
        'val_targets': ['lfw', 'cfp_fp', 'agedb_30'],  # bins shipped with the package
        'synthetic': False,              # read rec
        'sample_ratio': 1.0,             # 10k classes: no need to sample
        'warmup_steps': 0,               # no warm-up
        'lr_steps': [20000, 28000],      # original Partial FC MXNet schedule
        'max_update': 32000,             # about 33 epochs at global batch 512
    },
    'emore': {
        'rec': 'data/faces_emore/train.rec',  # MS1MV2 (MS1M-ArcFace), insightface's package
        'num_classes': 85742,            # identities in MS1MV2
        'image_size': 112,               # aligned 112x112 crops
        'num_images': 5822653,           # images in MS1MV2
        'val_targets': ['lfw', 'cfp_fp', 'agedb_30'],  # bins shipped with the package
        'synthetic': False,              # read rec
        'sample_ratio': 1.0,             # 86k classes: sampling optional
        'warmup_steps': 0,               # no warm-up
        'lr_steps': [100000, 160000, 220000],  # insightface ArcFace schedule for emore
        'max_update': 240000,            # about 21 epochs at global batch 512
    },
    'glint360k': {
        'rec': 'data/glint360k/train.rec',  # Glint360K, released with the Partial FC paper
        'num_classes': 360232,           # identities in Glint360K
        'image_size': 112,               # aligned 112x112 crops
        'num_images': 17091657,          # images in Glint360K
        'val_targets': ['lfw', 'cfp_fp', 'agedb_30'],  # add calfw, cplfw, cfp_ff, vgg2_fp if present
        'synthetic': False,              # read rec
        'sample_ratio': 0.1,             # the paper's setting: same IJB-C accuracy as 1.0
        'warmup_steps': 0,               # no warm-up
        'lr_steps': [200000, 400000, 500000, 550000],  # original Partial FC 8-GPU schedule
        'max_update': 600000,            # about 18 epochs at global batch 512
    },
    'synthetic_1m': {
        'rec': '',                       # unused: random data
        'num_classes': 1000000,          # one million identities, to measure speed and memory
        'image_size': 112,               # random 112x112 images
        'num_images': 0,                 # endless random stream
        'val_targets': [],               # nothing to verify on random data
        'synthetic': True,               # random images and labels
        'sample_ratio': 0.1,             # huge classifier: sample 10% of centers
        'sample_ratio_warmup_steps': 0,  # measure the steady state: no full-softmax warm-up (its memory too)
        'warmup_steps': 0,               # no warm-up
        'lr_steps': [20000, 28000],      # original Partial FC benchmark schedule
        'max_update': 32000,             # benchmark length
    },
}
BUILT_IN_DATASETS['synthetic_10m'] = dict(
    BUILT_IN_DATASETS['synthetic_1m'],    # the same random-data benchmark, with
    num_classes=10000000,                # ten million identities, the paper's headline scale
)


def card_datasets():
    """The card's DATASET_PRESETS ({name: {key: value}}: a user's own sets, or keys of a built-in
    set they change), or {} where no card can be imported."""
    if importlib.util.find_spec(CARD) is None:
        return {}
    try:
        card = importlib.import_module(CARD)
    except Exception as error:       # the user's own file: its mistake in one line, before anything runs
        where = f" (line {error.lineno})" if isinstance(error, SyntaxError) else ""
        sys.stderr.write(f"error: {CARD}.py, your card, does not load{where}: {type(error).__name__}: "
                         f"{getattr(error, 'msg', None) or error}\n")
        raise SystemExit(USAGE_EXIT) from None
    presets = getattr(card, 'DATASET_PRESETS', {})
    if not isinstance(presets, dict) or not all(isinstance(keys, dict) for keys in presets.values()):
        raise UsageError(f"{CARD}.py's DATASET_PRESETS is not a dict of name: {{key: value}}; see its docstring")
    return presets


DATASET_PRESETS = dict(BUILT_IN_DATASETS)
for _name, _keys in card_datasets().items():   # a built-in name: the card's keys over the preset's
    DATASET_PRESETS[_name] = {**BUILT_IN_DATASETS.get(_name, {}), **_keys}


LOSS_PRESETS = loss_presets()     # the published margins, by name: each margin word's (pfc/margin.py KINDS)

# A dataset's own recipe for a named loss, where the loss preset alone does not train that
# dataset in its steps (measured: BENCHMARKS.md, "Learning"). Applied after the loss preset;
# `--set` still overrides it. Other (dataset, loss) pairs use the presets unchanged.
DATASET_LOSS_RECIPES = {
    ('demo', 'arcface'): {
        'warmup_steps': 50,              # 260 steps, seed 0 / mean of 5 seeds: 0.925 / 0.916 (CosFace demo
    },                                   # 0.920 / 0.914); at the full lr from step 0: 0.895 / 0.910
}


DATASETS = tuple(DATASET_PRESETS)       # valid dataset preset names
NETWORKS = catalog.NETWORKS              # valid network preset names (symbols/catalog.py)
NETWORK_PRESETS = {name: catalog.preset(name) for name in NETWORKS}
LOSSES = tuple(LOSS_PRESETS)            # valid loss preset names
