"""Training rules read from a config: the lr a part trains with, a step count given as a share,
the bank's own lr and decay."""


LR_REFERENCE_BATCH = 512        # the key table's lr is given for this global batch


def scaled_lr(cfg, global_batch, part="backbone"):
    """The lr `part` ('backbone' or 'bank') trains with: its lr (cfg.lr; the bank's: bank_setting
    'lr'), given for a global batch of LR_REFERENCE_BATCH, scaled linearly to `global_batch` when
    cfg.lr_scale_by_world and the part trains with SGD (the bank always does). AdamW's lr is used
    as given: arcface_torch trains its ViTs at 1e-3 from 2,048 to 24,576 images a step."""
    sgd = part == "bank" or cfg.optimizer == "sgd"
    lr = bank_setting(cfg, "lr") if part == "bank" else cfg.lr
    return lr * (global_batch / LR_REFERENCE_BATCH if cfg.lr_scale_by_world and sgd else 1.0)


def steps_of(value, total):
    """A step count of an Int(share=True) key: `value` itself, or for 'N%' that share of `total`
    steps (rounded down)."""
    return int(total * float(value[:-1]) / 100) if isinstance(value, str) else value


def bank_setting(cfg, key):
    """The memory bank's 'lr' or 'wd': cfg.bank_<key>, or cfg.<key> (the backbone's) where that
    is 'same'."""
    value = cfg["bank_" + key]
    return cfg[key] if value == "same" else value
