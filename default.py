"""Training configuration: one easydict, every default commented where it is set.

    from default import get_config
    cfg = get_config(dataset='emore', network='r100', loss='arcface')

`get_config` builds a fresh config each call: the base below, then the network preset,
then the dataset preset, then the loss preset when one is named (later presets win; only
the demo dataset overlaps a network preset, shrinking the batch for CPU). Without a named
loss the dataset's own recipe stands: the base's ArcFace, or the demo's CosFace m=0.25. A loss
preset sets the published margins only; the scale s is the dataset's (64 as published for
10^4-10^7 identities; 32 for the demo's 200). A dataset may add its own recipe for a named
loss (_DATASET_LOSS_RECIPES: the demo warms ArcFace's lr up). Presets may only change keys
the base defines, and only to a value of the same type. Command-line `key=value`
overrides (sample_fc.config.apply_overrides) follow the same rule; call `check_config`
after them. The presets are chosen by name, so pass them to `get_config` rather than
overriding `dataset=...`, which would only rename the run.

This module imports nothing heavy (no mxnet): contexts are stored as strings and
resolved by train.py. Library code never imports this file.
"""
import copy
import math

from easydict import EasyDict as edict

from sample_fc.config import apply_overrides
from sample_fc.errors import UsageError
from sample_fc.stop import signal_number
from sample_fc.options import (ALLGATHERS, BACKBONE_INITS, BANK_CONTEXTS, CONTEXTS, HEAD_KERNELS,  # valid values
                               BANK_DTYPES, BANK_MOMENTA, LR_SCHEDULES, MOMENTUM_FORMS, is_probability)


def _base_config():
    """Return the base config: every key that exists, with its default and meaning."""
    cfg = edict()

    # ---- data -------------------------------------------------------------------
    cfg.dataset = 'demo'                 # dataset preset name, one of DATASETS
    cfg.rec = 'data/demo/train.rec'      # path to train.rec; train.idx and property sit next to it
    cfg.num_classes = 200                # number of identities C (must be >= world size)
    cfg.image_size = 112                 # square input side in pixels (images are 112x112 aligned faces)
    cfg.num_images = 0                   # number of training images; informational only, 0 = unknown
    cfg.val_targets = ['demo_val']       # verification sets, <name>.bin looked up next to rec
    cfg.data_threads = 2                 # decoding threads per worker for the RecordIO iterator
    cfg.synthetic = False                # True: random images and labels instead of reading rec
    cfg.aug_downscale = 0.0              # probability of shrinking an image to a random 0.5-1 of its side and back (low resolution; 0 = off)
    cfg.aug_blur = 0.0                   # probability of a Gaussian blur of radius 0.5-1.5 px (0 = off)
    cfg.aug_color_jitter = 0.0           # probability of scaling brightness, contrast and saturation by 0.8-1.2 each (0 = off)
    cfg.aug_grayscale = 0.0              # probability of converting an image to gray (0 = off)

    # ---- network ----------------------------------------------------------------
    cfg.network = 'mbf'                  # backbone preset name, one of NETWORKS (symbols/; the demo's is mbf_small)
    cfg.embedding_size = 512             # embedding dimension D produced by the backbone
    cfg.dropout = 0.0                    # dropout before the embedding layer (0 = off)
    cfg.fp16 = False                     # mixed precision for the backbone (GPU only)
    cfg.backbone_init = 'pytorch'        # pytorch: U(+-1/sqrt(fan_in)) conv/FC weights, PyTorch's default | xavier: MXNet Xavier magnitude 2

    # ---- loss: combined margin cos(m1*theta + m2) - m3, times s -------------------
    cfg.loss = 'arcface'                 # margin preset name, one of LOSSES
    cfg.loss_s = 64.0                    # scale s applied to the cosine logits (the dataset's: loss presets keep it)
    cfg.loss_m1 = 1.0                    # multiplicative angular margin m1 (SphereFace); 1 = off
    cfg.loss_m2 = 0.5                    # additive angular margin m2 (ArcFace), radians
    cfg.loss_m3 = 0.0                    # additive cosine margin m3 (CosFace)
    cfg.margin_warmup_steps = 0          # grow m2, m3 (and m1) linearly from 0 over this many steps (0 = full margin from the start)

    # ---- Partial FC ---------------------------------------------------------------
    cfg.sample_ratio = 1.0               # fraction of each rank's centers scored per step, in (0, 1]; or auto: the smallest ratio whose q*K/B
                                         # (draws of a center per visit of its class) reaches 35, where sampling matched ratio 1.0 (1.0 if none does; README "When to sample")
    cfg.sample_ratio_warmup_steps = 200  # score more centers first: the ratio goes linearly from sample_ratio_warmup_start at step 1 to sample_ratio at this step + 1 (0 = sample_ratio throughout; no effect at ratio 1). At ratio 0.1, 1000 steps, 5000 ids: 0.8475 held-out with it, 0.8170 without (BENCHMARKS.md)
    cfg.sample_ratio_warmup_start = 1.0  # the ratio at step 1 of that warm-up, in (0, 1] (the memory plan holds the larger of it and sample_ratio)
    cfg.sample_correction = True         # sampled-softmax correction: each sampled negative's logit + log(1/q), q its chance to be drawn, so the sample's softmax and loss estimate the full one's (no effect at ratio 1; no extra GEMM or collective). Held-out accuracy unchanged within one seed's spread, TAR@FAR=1e-3 up in each pair measured (BENCHMARKS.md)
    cfg.sample_wd_correction = False     # weight-decay correction: each sampled negative's bank row decays with wd / q in the update, not only wd in the 1 in 1/q updates it is drawn in (no effect at ratio 1; no extra GEMM or collective). 1000 steps, 5000 ids, 10k held-out pairs: at ratio 0.5 it closes the gap to ratio 1 (0.8721 vs 0.8644, four seeds); at ratio 0.1 it does not help (-0.4 +- 0.8 points over five seeds, a higher loss), so it is off by default (BENCHMARKS.md)
    cfg.context = 'auto'                 # backbone device: auto (gpu if mxnet sees one) | cpu | gpu
    cfg.bank_context = 'same'            # memory bank device: same (as context) | cpu
    cfg.bank_dtype = 'float32'           # bank storage: float32 | float16 (half the bytes per class; math in float32, stochastic rounding on write)
    cfg.bank_momentum = 'same'           # the bank's momentum: same (stored as the weights) | int8 (8-bit codes, a float32 scale per 64 columns, stochastic rounding on write) | none (no momentum for the
                                         # centers: plain SGD on them at lr / (1 - momentum), the step momentum builds up to; the backbone keeps its momentum; on the demo 1.0 point under float32 over five seeds; int8 +0.5 there, -0.24 on 5,000 glyph ids over three: BENCHMARKS.md). Bytes per identity at D 512, float32 / float16 bank: same 4096 / 2048, int8 2592 / 1568,
                                         # none 2048 / 1024. int8 and none need the bank in host memory (the host kernel: bank_context=cpu on GPUs, head_kernel auto or host)
    cfg.head_kernel = 'auto'             # head step: auto (host for a CPU bank, else device) | host (NumPy BLAS) | device (MXNet ops)
    cfg.allgather = 'native'             # embedding gather: native (hvd.allgather) | allreduce (zero-padded sum)

    # ---- optimisation -------------------------------------------------------------
    cfg.batch_size = 128                 # images per worker per step; global batch = batch_size * world size
    cfg.lr = 0.1                         # lr for a global batch of 512, scaled linearly by global batch / 512
    cfg.lr_scale_by_world = True         # True: apply that linear scaling; False: use lr as given
    cfg.momentum = 0.9                   # SGD momentum, backbone and memory bank alike
    cfg.momentum_form = 'pytorch'        # SGD momentum form, backbone and bank: pytorch: momentum of gradients, lr applied per step (no overshoot at lr drops) | mxnet: of lr-scaled steps
    cfg.wd = 5e-4                        # weight decay, backbone and memory bank alike (not on biases and BN betas)
    cfg.clip_grad_norm = 5.0             # scale the backbone's summed gradients to at most this global L2 norm (0 = off)
    cfg.lr_schedule = 'step'             # after the warm-up: step (x lr_factor at lr_steps) | poly ((1-t)^2) | cosine; t from 0 to 1 at max_update
    cfg.warmup_steps = 0                 # linear lr warm-up from 0 over this many steps (0 = none)
    cfg.lr_steps = [100000, 160000, 220000]  # steps at which lr is multiplied by lr_factor (increasing)
    cfg.lr_factor = 0.1                  # lr decay factor at each of lr_steps
    cfg.max_update = 240000              # total training steps; the loop stops after this one

    # ---- run control --------------------------------------------------------------
    cfg.seed = 0                         # random seed: data order (shared by all ranks), sampler (offset by rank), init
    cfg.frequent = 20                    # log speed and loss every N steps
    cfg.verify_period = 2000             # run verification on val_targets every N steps (0 = never; and at the end)
    cfg.ckpt_period = 10000              # save a checkpoint every N steps (and at the end)
    cfg.ckpt_keep = 3                    # keep the N most recent checkpoints, delete older ones
    cfg.ckpt_minutes = 30.0              # also save when the newest checkpoint is older than this (0 = off): a SIGKILL loses at most that
    cfg.stop_signals = ['SIGTERM', 'SIGINT', 'SIGUSR1']   # these stop the run cleanly: every rank ends the same step, checkpoint, exit 128+signal
    cfg.stop_grace_s = 25.0              # a stop taking longer (or a second signal) ends the job at once; below SLURM's/Kubernetes' 30 s
    cfg.tensorboard = False              # write tensorboardX event files to the output dir
    cfg.max_nonfinite_steps = 5          # stop with an error after N consecutive steps with NaN/Inf loss
    cfg.collective_timeout_s = 60        # stall limit: ranks waiting this long in a collective others miss end the job
    cfg.step_timeout_s = 0               # a rank with no finished step for this long ends the job (0 = max(300 s, 10x median step))
    return cfg


# Network presets: backbone shape and per-worker batch. Batch 128 x 8 GPUs (global 1024)
# is insightface's arcface_torch recipe; r100 halves it to fit 16-32 GB GPUs.
_NETWORK_PRESETS = {
    'r18': {
        'embedding_size': 512,           # IResNet-18, insightface's 512-d embedding
        'dropout': 0.0,                  # no dropout, as in arcface_torch
        'fp16': False,                   # fp32 by default; set fp16=true on GPUs with tensor cores
        'batch_size': 128,               # per worker
    },
    'r34': {
        'embedding_size': 512,           # IResNet-34
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 128,               # per worker
    },
    'r50': {
        'embedding_size': 512,           # IResNet-50
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 128,               # per worker
    },
    'r100': {
        'embedding_size': 512,           # IResNet-100, the Partial FC paper's main backbone
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 64,                # per worker (the original Partial FC MXNet default)
    },
    'r200': {
        'embedding_size': 512,           # IResNet-200, arcface_torch's largest IResNet (its best WebFace42M result)
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 64,                # per worker, as r100 (about twice r100's activations: halve on 16 GB GPUs)
    },
    'mbf': {
        'embedding_size': 512,           # MobileFaceNet at twice the paper's widths: arcface_torch's mbf
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 128,               # per worker
    },
    'mbf_large': {
        'embedding_size': 512,           # MobileFaceNet blocks (2, 8, 12, 4) at 4x widths: arcface_torch's mbf_large
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 128,               # per worker
    },
    'mbf_small': {
        'embedding_size': 512,           # the MobileFaceNet paper's network (half mbf's widths; sample_fc's mbf before)
        'dropout': 0.0,                  # no dropout
        'fp16': False,                   # fp32 by default
        'batch_size': 128,               # per worker
    },
}

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
        'max_update': 260,               # ~4 min on 2 CPU workers with mbf_small (~4 epochs): held-out 0.9133 (seeds 1-5: 0.913 mean; 400 steps, decay at 280, 350: 0.9233)
        'frequent': 20,                  # log often
        'verify_period': 130,            # verify halfway and at the end
        'ckpt_period': 130,              # checkpoint halfway and at the end
    },
    'custom': {                          # your own set: --dataset custom --set rec=DIR/train.rec (tools.pack writes one)
        'rec': '',                       # required: the set's train.rec (train.idx and property beside it)
        'num_classes': 0,                # from the set's property file (train.py reads it), unless --set
        'val_targets': [],               # none: --set 'val_targets=["NAME"]' for NAME.bin beside train.rec (tools.make_bin)
        'loss': 'cosface',               # the demo's small-set recipe: CosFace ...
        'loss_s': 32.0,                  # ... at s=32 (5,000 classes learned at it) ...
        'loss_m2': 0.0,                  # ... no angular margin ...
        'loss_m3': 0.25,                 # ... and a cosine margin of 0.25
        'embedding_size': 128,           # small head for a small set (512 for faces at scale)
        'batch_size': 64,                # per worker
        'lr': 0.1,                       # ... at the base's lr, not the demo's 0.8: on 5,000 real-image classes lr 0.8 sat at chance
                                         # (0.52 held-out at step 400) where 0.1 learned (0.80; BENCHMARKS.md, "A recipe for your own set")
        'sample_ratio': 'auto',          # the smallest ratio where sampling matched ratio 1.0 (README "When to sample")
        'warmup_steps': 0,               # no lr warm-up (it did not help: BENCHMARKS.md)
        'max_update': 1000,              # set it for your set: 1000 steps x 128 images is ~2 epochs of 5,000 x 12 images
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
        'loss_m1': 1.0,                  # ArcFace (Deng et al., CVPR 2019): no multiplicative margin
        'loss_m2': 0.5,                  # additive angular margin 0.5 rad
        'loss_m3': 0.0,                  # no cosine margin
    },
    'cosface': {
        'loss_m1': 1.0,                  # CosFace (Wang et al., CVPR 2018): no multiplicative margin
        'loss_m2': 0.0,                  # no angular margin
        'loss_m3': 0.4,                  # additive cosine margin 0.4
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
NETWORKS = tuple(_NETWORK_PRESETS)       # valid network preset names
LOSSES = tuple(_LOSS_PRESETS)            # valid loss preset names


def _apply_preset(cfg, kind, name, presets):
    """Copy preset `name` of `presets` into cfg; the preset may only change existing keys
    to values of the same type."""
    if name not in presets:
        raise UsageError(f"unknown {kind} preset {name!r}; choose one of: {', '.join(presets)}")
    for key, value in presets[name].items():
        if key not in cfg:
            raise UsageError(f"{kind} preset {name!r} sets {key!r}, which the base config lacks")
        if type(value) is not type(cfg[key]) and value not in WORD_VALUES.get(key, ()):
            raise UsageError(f"{kind} preset {name!r} sets {key!r} to {value!r} "
                             f"({type(value).__name__}); the base has {type(cfg[key]).__name__}")
        cfg[key] = copy.deepcopy(value)  # presets are shared; configs must not alias them


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
                  'val_targets', 'data_threads',
                  'collective_timeout_s', 'step_timeout_s', 'max_nonfinite_steps', 'context', 'bank_context',
                  'head_kernel', 'allgather', 'aug_downscale', 'aug_blur', 'aug_color_jitter', 'aug_grayscale')

# Keys that take a word besides their type's values: resolved when the run's shape is known
# (builder.resolve_auto), and saved resolved in the run's config.
WORD_VALUES = {'sample_ratio': ('auto',)}

# Keys added after runs were saved without them, with the value that behaves as those runs
# did (a run resumed from such a checkpoint goes on as it trained; the preset default
# would change its loss).
VALUE_BEFORE_KEY = {'clip_grad_norm': 0.0, 'backbone_init': 'xavier', 'momentum_form': 'mxnet',
                    'sample_ratio_warmup_steps': 0,    # runs saved before the sampling warm-up sample as they did
                    'sample_correction': False,        # and before the sampled-softmax correction, uncorrected
                    'sample_wd_correction': False,     # and before the weight-decay correction, decayed with wd
                    'bank_momentum': 'same'}           # and before bank_momentum, with the momentum stored as the weights

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
    saved = {_renamed(key, note): value for key, value in saved.items()}
    cfg = get_config(saved.get('dataset'), saved.get('network'), saved.get('loss'))
    for key in cfg:
        if key in saved:
            cfg[key] = copy.deepcopy(saved[key])
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
        saved = config_from_checkpoint(resumed, note)
        cfg = copy.deepcopy(saved)
        cfg.update({key: value for key, value in (('dataset', dataset), ('network', network),
                                                  ('loss', loss)) if value is not None})
    apply_overrides(cfg, overrides, WORD_VALUES)
    if resumed is not None:
        resume_changes(saved, cfg)
    check_config(cfg, data=resumed is not None)   # a new run's data: once the property file is read
    return cfg


def _fail(key, value, expected):
    raise UsageError(f"config key {key!r} is {value!r}; expected {expected}")


def check_config(cfg, data=True):
    """Check the values a type check cannot: choices, ranges, schedule order; with `data`,
    that the config names its data (rec, num_classes: the custom preset leaves them to --set
    and the property file).

    Call after applying overrides. Raises UsageError naming the key, the bad value and
    what is allowed. World-size checks (num_classes >= workers) belong to train.py.
    """
    for key, choices in (('dataset', DATASETS), ('network', NETWORKS), ('loss', LOSSES),
                         ('context', CONTEXTS), ('bank_context', BANK_CONTEXTS),
                         ('allgather', ALLGATHERS), ('head_kernel', HEAD_KERNELS),
                         ('lr_schedule', LR_SCHEDULES), ('backbone_init', BACKBONE_INITS),
                         ('momentum_form', MOMENTUM_FORMS), ('bank_dtype', BANK_DTYPES),
                         ('bank_momentum', BANK_MOMENTA)):
        if cfg[key] not in choices:
            _fail(key, cfg[key], f"one of: {', '.join(choices)}")
    if data and not cfg.synthetic and not cfg.rec:
        _fail('rec', cfg.rec, "a path to train.rec (or synthetic=true)" + (
            "; dataset custom trains your own set: --set rec=DIR/train.rec (python -m sample_fc.tools.pack "
            "--images FOLDER --out DIR/train makes one)" if cfg.dataset == 'custom' else ""))
    if data and cfg.num_classes < 1:
        _fail('num_classes', cfg.num_classes, "an integer >= 1 (train.py reads it from the property file beside rec)")
    for key in ('image_size', 'embedding_size', 'batch_size', 'max_update',
                'data_threads', 'frequent', 'ckpt_period', 'ckpt_keep', 'max_nonfinite_steps',
                'collective_timeout_s'):
        if cfg[key] < 1:
            _fail(key, cfg[key], "an integer >= 1")
    if not (math.isfinite(cfg.ckpt_minutes) and cfg.ckpt_minutes >= 0):
        _fail('ckpt_minutes', cfg.ckpt_minutes, "a finite float >= 0 (0 = no checkpoints by the clock)")
    if not (math.isfinite(cfg.stop_grace_s) and cfg.stop_grace_s > 0):
        _fail('stop_grace_s', cfg.stop_grace_s, "a finite float > 0 (seconds)")
    for name in cfg.stop_signals:
        try:
            signal_number(name)
        except ValueError as err:
            _fail('stop_signals', cfg.stop_signals, f"signal names ({err})")
    if cfg.image_size % 16:
        _fail('image_size', cfg.image_size, "a multiple of 16 (every backbone downsamples by 16: 112 -> 7x7; "
              "a dataset's images are resized to it)")
    for key in ('num_images', 'warmup_steps', 'verify_period', 'step_timeout_s', 'margin_warmup_steps',
                'sample_ratio_warmup_steps'):
        if cfg[key] < 0:
            _fail(key, cfg[key], "an integer >= 0")
    for key in ('sample_ratio', 'sample_ratio_warmup_start'):
        if cfg[key] in WORD_VALUES.get(key, ()):
            continue
        if not 0.0 < cfg[key] <= 1.0:
            _fail(key, cfg[key], "a float in (0, 1]" + (" or auto" if key in WORD_VALUES else ""))
    if not 0.0 <= cfg.dropout < 1.0:
        _fail('dropout', cfg.dropout, "a float in [0, 1)")
    for key in ('aug_downscale', 'aug_blur', 'aug_color_jitter', 'aug_grayscale'):
        if not is_probability(cfg[key]):
            _fail(key, cfg[key], "a float in [0, 1] (a probability)")
    for key in ('lr', 'loss_s', 'loss_m1'):
        if not (math.isfinite(cfg[key]) and cfg[key] > 0):
            _fail(key, cfg[key], "a finite float > 0")
    for key in ('momentum', 'wd', 'lr_factor', 'loss_m2', 'loss_m3', 'clip_grad_norm'):
        if not (math.isfinite(cfg[key]) and cfg[key] >= 0):
            _fail(key, cfg[key], "a finite float >= 0")
    if cfg.lr_schedule != 'step' and cfg.warmup_steps >= cfg.max_update:
        _fail('warmup_steps', cfg.warmup_steps, f"fewer than max_update={cfg.max_update} for lr_schedule={cfg.lr_schedule}")
    steps = cfg.lr_steps
    if any(not isinstance(s, int) or s < 1 for s in steps) or sorted(set(steps)) != list(steps):
        _fail('lr_steps', steps, "strictly increasing positive integers")
