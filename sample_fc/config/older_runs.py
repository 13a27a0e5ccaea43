"""Reading an older run: the keys a resumed run may change, the values of keys added since a
run was saved, and keys renamed since. One file holds every such rule."""
from ..errors import UsageError


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


def current_name(key, note):
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
        renamed.append(f"{current_name(key.strip(), note)}{sep}{value}" if key.strip() in RENAMED_KEYS else text)
    return renamed


def overridden_keys(overrides):
    """The (current) names of the keys a list of `key=value` overrides sets."""
    return {text.split('=', 1)[0].strip() for text in renamed_overrides(overrides)}


def resume_changes(saved, cfg):
    """UsageError naming the first fixed key whose value differs between the resumed run's
    config `saved` and `cfg` (the same run with this command line's settings)."""
    for key in cfg:
        if key not in RESUME_MUTABLE and cfg[key] != saved[key]:
            raise UsageError(f"{key}={cfg[key]!r} would change the run being resumed, which has "
                             f"{key}={saved[key]!r}; a resumed run keeps its model and data (keys that "
                             f"may change: {', '.join(RESUME_MUTABLE)}); start a new run instead")
