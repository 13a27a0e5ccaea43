"""The key table: every config key once, with its declared type (kind, range, the words it
takes besides its values, e.g. sample_ratio=auto), its default and its meaning in one line.
docs/training.md, "Key reference", explains each key in this order (a test keeps it so).
Every reader of a value converts and checks through it: the presets, `--set key=value`, an
experiment file, a resumed run's saved config and check_config."""
from ..symbols.catalog import DEFAULT_NETWORK
from ..options import (ALLGATHERS, BACKBONE_INITS, BANK_CONTEXTS, BANK_DTYPES, BANK_MOMENTUM_WORDS,  # valid values
                       CONTEXTS, EMBEDDING_SCALES, HEAD_KERNELS, LR_SCHEDULES, MOMENTUM_FORMS, OPTIMIZERS,
                       TAIL_BNS, WANDB_MODES, signal_number)
from ..pfc.margin import MARGINS
from .key_types import Choice, Flag, Int, KeyTable, ListOf, Real, Text
from .presets import DATASETS, LOSSES, NETWORKS


def _target_name(name):
    """A verification set's name: NAME.bin is looked up beside train.rec (ValueError if not one)."""
    if not name or '/' in name:
        raise ValueError(f"{name!r} is not a file name: NAME for NAME.bin beside train.rec")


def declare_keys():
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
    keys.network = Choice(DEFAULT_NETWORK, NETWORKS)                    # backbone preset name, one of NETWORKS
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


KEYS = declare_keys()                   # {key: its declared type (key_types.KeyType)}
