"""Training configuration: every key declared once with its type, range, default and meaning.

    from default import get_config
    cfg = get_config(dataset='emore', network='r100', loss='arcface')

`_declare_keys` below is the one table of keys: each has a declared type (sample_fc.config:
Flag, Int, Real, Text, Choice, ListOf, with its range and any words it takes besides its
values, e.g. sample_ratio=auto). Every reader of a value converts and checks through it:
the presets, command-line `key=value` overrides (sample_fc.config.apply_overrides), a
resumed run's saved config (config_from_checkpoint) and check_config. The table
comments each key in one line; docs/training.md, "Key reference", explains each in its order.

`get_config` builds a fresh config each call: the declared defaults, then the network preset,
then the dataset preset, then the network family's training recipe (symbols/catalog.py: the
ViTs' AdamW; the dataset's SGD recipe moves to the bank), then the loss preset when one is named (later presets win; only
the demo dataset overlaps a network preset, shrinking the batch for CPU). Without a named
loss the dataset's own recipe stands: the base's ArcFace, or the demo's CosFace m=0.25. A loss
preset sets the published margins only; the scale s is the dataset's (64 as published for
10^4-10^7 identities; 32 for the demo's 200). A dataset may add its own recipe for a named
loss (_DATASET_LOSS_RECIPES: the demo warms ArcFace's lr up). Call `check_config` after
overrides. The presets are chosen by name, so pass them to `get_config` rather than
overriding `dataset=...`, which would only rename the run.

This module imports nothing heavy (no mxnet): contexts are stored as strings and
resolved by train.py. Library code never imports this file.
"""
import copy

from sample_fc.config import Choice, Flag, Int, KeyTable, ListOf, Real, Text, apply_overrides, defaults, steps_of
from sample_fc.errors import UsageError
from sample_fc.run.stop import signal_number
from symbols import catalog
from sample_fc.options import (ALLGATHERS, BACKBONE_INITS, BANK_CONTEXTS, CONTEXTS, HEAD_KERNELS,  # valid values
                               BANK_DTYPES, BANK_MOMENTUM_WORDS, EMBEDDING_SCALES, LR_SCHEDULES, MARGINS,
                               MOMENTUM_FORMS, OPTIMIZERS, TAIL_BNS, WANDB_MODES, margin_key_problem)


def _target_name(name):
    """A verification set's name: NAME.bin is looked up beside train.rec (ValueError if not one)."""
    if not name or '/' in name:
        raise ValueError(f"{name!r} is not a file name: NAME for NAME.bin beside train.rec")


def _declare_keys():
    """Every config key that exists: its declared type (range, allowed words), its default
    and its meaning. Presets, `--set`, a saved run's config and tools convert through it."""
    keys = KeyTable()

    # ---- data -------------------------------------------------------------------
    keys.dataset = Choice('demo', DATASETS)                             # dataset preset name, one of DATASETS
    keys.rec = Text('data/demo/train.rec')                              # path to train.rec; train.idx, property beside
    keys.num_classes = Int(200, lo=0, hi=2 ** 40)                       # number of identities C (must be >= world size)
    keys.image_size = Int(112, lo=16, hi=1024, multiple=16)             # square input side in pixels
    keys.num_images = Int(0, lo=0, hi=2 ** 48)                          # training images; informational, 0 = unknown
    keys.val_targets = ListOf(['demo_val'], Text(''), check=_target_name)  # verification sets: NAME.bin beside rec
    keys.data_threads = Int(2, lo=1, hi=256)                            # decoding threads per worker (RecordIO)
    keys.synthetic = Flag(False)                                        # True: random images and labels, no rec
    keys.aug_downscale = Real(0.0, lo=0, hi=1)                          # P(downscale to 0.5-1 of the side); 0 = off
    keys.aug_blur = Real(0.0, lo=0, hi=1)                               # P(Gaussian blur, radius 0.5-1.5 px); 0 = off
    keys.aug_color_jitter = Real(0.0, lo=0, hi=1)                       # P(brightness/contrast/saturation x0.8-1.2)
    keys.aug_grayscale = Real(0.0, lo=0, hi=1)                          # probability of a gray image (0 = off)

    # ---- network ----------------------------------------------------------------
    keys.network = Choice('mbf', NETWORKS)                              # backbone preset name, one of NETWORKS
    keys.embedding_size = Int(512, lo=1, hi=65536)                      # embedding dimension D produced by the backbone
    keys.dropout = Real(0.0, lo=0, hi=1, hi_open=True)                  # dropout before the embedding layer (0 = off)
    keys.fp16 = Flag(False)                                             # mixed precision for the backbone (GPU only)
    keys.embedding_scale = Choice('fixed', EMBEDDING_SCALES)            # embedding BatchNorm's gamma: fixed | learned
    keys.bn_frozen = Flag(False)                                        # True: BatchNorms use and keep moving stats
    keys.tail_bn = Choice('worker', TAIL_BNS)                           # BNs over samples only: worker | global batch
    keys.backbone_init = Choice('arcface_torch', BACKBONE_INITS)        # init: arcface_torch | pytorch | xavier

    # ---- loss: combined margin cos(m1*theta + m2) - m3, times s -------------------
    keys.loss = Choice('arcface', LOSSES)                               # margin preset name, one of LOSSES
    keys.loss_margin = Choice('combined', MARGINS)                      # target logit: combined | curricularface
    keys.loss_s = Real(64.0, lo=0, lo_open=True, hi=1e4)                # scale s of the cosine logits (the dataset's)
    keys.loss_m1 = Real(1.0, lo=0, lo_open=True, hi=100)                # multiplicative angular margin m1; 1 = off
    keys.loss_m2 = Real(0.5, lo=0, hi=100)                              # additive angular margin m2 (ArcFace), radians
    keys.loss_m3 = Real(0.0, lo=0, hi=100)                              # additive cosine margin m3 (CosFace)
    keys.margin_warmup_steps = Int(0, lo=0, hi=2 ** 40)                 # margin grows from 0 over N steps (0 = off)

    # ---- Partial FC ---------------------------------------------------------------
    keys.sample_ratio = Real(1.0, lo=0, lo_open=True, hi=1, words=('auto',))  # fraction of centers scored, or auto
    keys.sample_ratio_warmup_steps = Int(200, lo=0, hi=2 ** 40)         # sampling warm-up length in steps (0 = off)
    keys.sample_ratio_warmup_start = Real(1.0, lo=0, lo_open=True, hi=1)  # the sampling warm-up's ratio at step 1
    keys.sample_correction = Flag(True)                                 # sampled-softmax correction: logit + log(1/q)
    keys.sample_wd_correction = Flag(False)                             # weight-decay correction: wd / q on samples
    keys.context = Choice('auto', CONTEXTS)                             # backbone device: auto | cpu | gpu
    keys.bank_context = Choice('same', BANK_CONTEXTS)                   # memory bank device: same (as context) | cpu
    keys.bank_dtype = Choice('float32', BANK_DTYPES)                    # bank storage: float32 | float16 | int8
    keys.bank_momentum = Choice('same', BANK_MOMENTUM_WORDS)            # bank's momentum: auto | same | int8 | none
    keys.head_kernel = Choice('auto', HEAD_KERNELS)                     # head step: auto | host (NumPy BLAS) | device
    keys.allgather = Choice('native', ALLGATHERS)                       # embedding gather: native | allreduce

    # ---- optimisation -------------------------------------------------------------
    keys.batch_size = Int(128, lo=1, hi=2 ** 20)                        # images per worker per step
    keys.lr = Real(0.1, lo=0, lo_open=True, hi=1e6)                     # backbone lr (SGD's per global batch of 512)
    keys.lr_scale_by_world = Flag(True)                                 # True: scale SGD lrs by global batch / 512
    keys.momentum = Real(0.9, lo=0, hi=1, hi_open=True)                 # SGD momentum, backbone and bank
    keys.momentum_form = Choice('pytorch', MOMENTUM_FORMS)              # SGD momentum form: pytorch | mxnet
    keys.wd = Real(5e-4, lo=0, hi=1)                                    # weight decay, backbone and bank
    keys.optimizer = Choice('sgd', OPTIMIZERS)                          # backbone optimizer: sgd | adamw (bank: SGD)
    keys.adamw_beta1 = Real(0.9, lo=0, hi=1, hi_open=True)              # AdamW's decay of the gradients' mean
    keys.adamw_beta2 = Real(0.999, lo=0, hi=1, hi_open=True)            # AdamW's decay of the squared gradients' mean
    keys.adamw_eps = Real(1e-8, lo=0, lo_open=True, hi=1)               # AdamW's epsilon (denominator)
    keys.bank_lr = Real('same', lo=0, lo_open=True, hi=1e6, words=('same',))  # the bank's SGD lr, per 512; same = lr
    keys.bank_wd = Real('same', lo=0, hi=1, words=('same',))            # the bank's weight decay: same = wd
    keys.decay_all = Flag(False)                                        # True: decay biases and BN betas too
    keys.clip_grad_norm = Real(5.0, lo=0, hi=1e12)                      # max global L2 norm of backbone grads; 0 = off
    keys.lr_schedule = Choice('step', LR_SCHEDULES)                     # after the warm-up: step | poly | cosine
    keys.warmup_steps = Int(0, lo=0, hi=2 ** 40, share=True)            # linear lr warm-up: N steps or N% (0 = none)
    keys.lr_steps = ListOf([100000, 160000, 220000], Int(1, lo=1, hi=2 ** 40), increasing=True)  # steps: lr x lr_factor
    keys.lr_factor = Real(0.1, lo=0, hi=1e6)                            # lr decay factor at each of lr_steps
    keys.max_update = Int(240000, lo=1, hi=2 ** 40)                     # total training steps

    # ---- run control --------------------------------------------------------------
    keys.seed = Int(0, lo=0, hi=2 ** 31 - 1)                            # random seed: data order, sampler, init
    keys.frequent = Int(20, lo=1, hi=2 ** 40)                           # log speed and loss every N steps
    keys.verify_period = Int(2000, lo=0, hi=2 ** 40)                    # verify every N steps (0 = only at the end)
    keys.ckpt_period = Int(10000, lo=1, hi=2 ** 40)                     # checkpoint every N steps (and at the end)
    keys.ckpt_keep = Int(3, lo=1, hi=10 ** 6)                           # keep the N newest checkpoints
    keys.ckpt_minutes = Real(30.0, lo=0, hi=10 ** 6)                    # save if newest is older than N min; 0 = off
    keys.stop_signals = ListOf(['SIGTERM', 'SIGINT', 'SIGUSR1'], Text(''), check=signal_number)  # clean-stop signals
    keys.stop_grace_s = Real(25.0, lo=0, lo_open=True, hi=3600)         # a stop's time limit in seconds
    keys.tensorboard = Flag(True)                                       # TensorBoard event files (rank 0)
    keys.wandb = Choice('off', WANDB_MODES)                             # Weights & Biases: off | offline | online
    keys.wandb_project = Text('sample_fc')                              # the W&B project (wandb=offline|online)
    keys.max_nonfinite_steps = Int(5, lo=1, hi=2 ** 40)                 # stop after N NaN/Inf-loss steps in a row
    keys.not_learning_steps = Int(200, lo=0, hi=2 ** 40)                # warn if not learning for N steps (0 = never)
    keys.collective_timeout_s = Int(60, lo=1, hi=10 ** 6)               # collective stall limit in seconds
    keys.step_timeout_s = Int(0, lo=0, hi=10 ** 7)                      # step watchdog limit in seconds (0 = auto)
    return vars(keys)


# Network presets, and a family's training recipe (the ViTs'), are symbols/catalog.py's: every
# network's name, family, shape and preset (embedding_size, dropout, fp16, batch_size) live there.


def _apply_family_recipe(cfg, network, dataset):
    """The training recipe of `network`'s family (catalog.FAMILY_RECIPES), if it has one, on a
    config that has its dataset preset: the dataset's SGD lr and weight decay move to the bank
    (bank_lr, bank_wd); the family's margin where the dataset has no margin of its own."""
    recipe = catalog.recipe(network)
    if recipe is None:
        return
    cfg.bank_lr, cfg.bank_wd = cfg.lr, cfg.wd              # the dataset's SGD recipe, for the centers
    _apply_preset(cfg, 'network recipe', network, {network: recipe['keys']})
    if 'loss' not in _DATASET_PRESETS[dataset]:
        _apply_preset(cfg, 'loss', recipe['margin_loss'], _LOSS_PRESETS)
        cfg.loss = recipe['margin_loss']                   # recorded as a named loss preset is


# The network a dataset trains when none is named (others: the base's `network`). The demo
# keeps the paper's small MobileFaceNet to train in minutes on 2 CPU cores.
_DATASET_NETWORKS = {
    'demo': 'mbf_small',
    'custom': 'mbf_small',
}

# Dataset presets. Schedules assume 8 workers; the step counts give about 20 epochs at a
# global batch of 512 (emore: 240000 * 512 / 5.8M images = 21 epochs).
_DATASET_PRESETS = {
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
_DATASET_PRESETS['synthetic_10m'] = dict(
    _DATASET_PRESETS['synthetic_1m'],    # the same random-data benchmark, with
    num_classes=10000000,                # ten million identities, the paper's headline scale
)

# Loss presets: published margins. Not the scale s: both papers use s = 64 for their
# ~10^4-10^5 identities, which the base config holds; a small set trains at a smaller s
# (the demo preset's 32), as the scale a softmax over C classes needs grows with log C.
_LOSS_PRESETS = {
    'arcface': {
        'loss_margin': 'combined',       # the target logit's margin only
        'loss_m1': 1.0,                  # ArcFace (Deng et al., CVPR 2019): no multiplicative margin
        'loss_m2': 0.5,                  # additive angular margin 0.5 rad
        'loss_m3': 0.0,                  # no cosine margin
    },
    'cosface': {
        'loss_margin': 'combined',       # the target logit's margin only
        'loss_m1': 1.0,                  # CosFace (Wang et al., CVPR 2018): no multiplicative margin
        'loss_m2': 0.0,                  # no angular margin
        'loss_m3': 0.4,                  # additive cosine margin 0.4
    },
    'curricularface': {
        'loss_margin': 'curricularface',  # CurricularFace (Huang et al., CVPR 2020): hard negatives weighted
        'loss_m1': 1.0,                  # by a running mean of the target cosines
        'loss_m2': 0.5,                  # its angular margin m = 0.5 rad
        'loss_m3': 0.0,                  # no cosine margin
    },
}

# A dataset's own recipe for a named loss, where the loss preset alone does not train that
# dataset in its steps (measured: BENCHMARKS.md, "Learning"). Applied after the loss preset;
# `--set` still overrides it. Other (dataset, loss) pairs use the presets unchanged.
_DATASET_LOSS_RECIPES = {
    ('demo', 'arcface'): {
        'warmup_steps': 50,              # 260 steps, seed 0 / mean of 5 seeds: 0.925 / 0.916 (CosFace demo
    },                                   # 0.920 / 0.914); at the full lr from step 0: 0.895 / 0.910
}

DATASETS = tuple(_DATASET_PRESETS)       # valid dataset preset names
NETWORKS = catalog.NETWORKS               # valid network preset names (symbols/catalog.py)
_NETWORK_PRESETS = {name: catalog.preset(name) for name in NETWORKS}
LOSSES = tuple(_LOSS_PRESETS)            # valid loss preset names
KEYS = _declare_keys()                   # {key: its declared type (sample_fc.config.KeyType)}


def _base_config():
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
    return _DATASET_NETWORKS.get(dataset, _base_config().network)


def get_config(dataset='demo', network=None, loss=None):
    """Return a new config for the given presets.

    Args:
        dataset: one of DATASETS.
        network: one of NETWORKS, or None for the dataset's (default_network).
        loss: one of LOSSES (its published margins), or None for the dataset's own recipe.
    Raises:
        UsageError: an unknown preset name (the message lists the choices).
    """
    cfg = _base_config()
    network = network or default_network(dataset)
    _apply_preset(cfg, 'network', network, _NETWORK_PRESETS)
    _apply_preset(cfg, 'dataset', dataset, _DATASET_PRESETS)
    _apply_family_recipe(cfg, network, dataset)
    if loss is not None:
        _apply_preset(cfg, 'loss', loss, _LOSS_PRESETS)
        cfg.loss = loss                  # the chosen presets, recorded in config.json
        if (dataset, loss) in _DATASET_LOSS_RECIPES:
            _apply_preset(cfg, 'dataset recipe for loss', (dataset, loss), _DATASET_LOSS_RECIPES)
    cfg.network = network                # (see above)
    cfg.dataset = dataset                # (see above)
    check_config(cfg, data=False)        # the custom preset names no data: --set rec= does
    return cfg


# Keys a resumed run may change (`--resume RUN --set key=value`): they steer how long it runs,
# the tail of its lr schedule, logging, checkpoints, evaluation, augmentation and how it
# executes, not the model or the data it learns from. Every other key is fixed by the run's checkpoint, and
# setting it to another value on resume is an error naming the key and both values.
RESUME_MUTABLE = ('max_update', 'lr_steps', 'lr_factor', 'warmup_steps', 'frequent', 'verify_period',
                  'ckpt_period', 'ckpt_keep', 'ckpt_minutes', 'stop_signals', 'stop_grace_s', 'tensorboard',
                  'wandb', 'wandb_project',
                  'val_targets', 'data_threads',
                  'collective_timeout_s', 'step_timeout_s', 'max_nonfinite_steps', 'not_learning_steps', 'context',
                  'bank_context', 'head_kernel', 'allgather', 'bn_frozen', 'aug_downscale', 'aug_blur',
                  'aug_color_jitter', 'aug_grayscale')

# Keys added after runs were saved without them, with the value that behaves as those runs
# did (a run resumed from such a checkpoint goes on as it trained; the preset default
# would change its loss).
VALUE_BEFORE_KEY = {'clip_grad_norm': 0.0, 'backbone_init': 'xavier', 'momentum_form': 'mxnet',
                    'sample_ratio_warmup_steps': 0,    # runs saved before the sampling warm-up sample as they did
                    'sample_correction': False,        # and before the sampled-softmax correction, uncorrected
                    'sample_wd_correction': False,     # and before the weight-decay correction, decayed with wd
                    'bank_momentum': 'same',           # and before bank_momentum, with the momentum stored as the
                                                       # weights
                    'optimizer': 'sgd',                # and before AdamW (ViTs then trained with SGD), with SGD
                    'bank_lr': 'same', 'bank_wd': 'same'}  # and before the bank's own lr and decay, with the backbone's

# Keys renamed since runs were saved (old name -> new name). The old name is still read, from a
# saved run's config and from `--set old=value`, with a one-line note; it is never written.
RENAMED_KEYS = {'sgd_momentum': 'momentum_form', 'verbose': 'verify_period'}


def _renamed(key, note):
    """The current name of config key `key`; note(line) when it is an old name."""
    if key in RENAMED_KEYS:
        note(f"config key {key!r} is now called {RENAMED_KEYS[key]!r}; read as {RENAMED_KEYS[key]!r}")
        return RENAMED_KEYS[key]
    return key


def renamed_overrides(overrides, note=lambda line: None):
    """`key=value` overrides with old key names (RENAMED_KEYS) replaced by the current ones."""
    renamed = []
    for text in overrides:
        key, sep, value = text.partition('=')
        renamed.append(f"{_renamed(key.strip(), note)}{sep}{value}" if key.strip() in RENAMED_KEYS else text)
    return renamed


def overridden_keys(overrides):
    """The (current) names of the keys a list of `key=value` overrides sets."""
    return {text.split('=', 1)[0].strip() for text in renamed_overrides(overrides)}


def config_from_checkpoint(saved, note=lambda line: None):
    """The config of a saved run (the `config` of a checkpoint's state.json): the defaults of
    its presets for keys added since it was written (VALUE_BEFORE_KEY where the default would
    change how it trains), then every saved value (under its current name: RENAMED_KEYS).
    Raises UsageError for a preset name this version does not know."""
    if not isinstance(saved, dict):
        raise UsageError(f"the saved config is a {type(saved).__name__}, not a JSON object of config keys")
    saved = {_renamed(key, note): value for key, value in saved.items()}
    presets = [None if saved.get(key) is None else KEYS[key].accept(key, saved[key])
               for key in ('dataset', 'network', 'loss')]
    cfg = get_config(*presets)
    for key in cfg:
        if key in saved:
            cfg[key] = KEYS[key].accept(key, copy.deepcopy(saved[key]))
        elif key in VALUE_BEFORE_KEY:
            cfg[key] = VALUE_BEFORE_KEY[key]
    return cfg


def resume_changes(saved, cfg):
    """UsageError naming the first fixed key whose value differs between the resumed run's
    config `saved` and `cfg` (the same run with this command line's settings)."""
    for key in cfg:
        if key not in RESUME_MUTABLE and cfg[key] != saved[key]:
            raise UsageError(f"{key}={cfg[key]!r} would change the run being resumed, which has "
                             f"{key}={saved[key]!r}; a resumed run keeps its model and data (keys that "
                             f"may change: {', '.join(RESUME_MUTABLE)}); start a new run instead")


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
    problem = margin_key_problem(cfg.loss_margin, cfg.loss_m1, cfg.loss_m3)
    if problem:
        _fail(*problem)
    if cfg.lr_schedule != 'step' and steps_of(cfg.warmup_steps, cfg.max_update) >= cfg.max_update:
        _fail('warmup_steps', cfg.warmup_steps,
              f"fewer than max_update={cfg.max_update} for lr_schedule={cfg.lr_schedule}")
