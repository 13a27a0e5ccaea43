"""Every network by name: its family, its shape, its preset and what was measured of it (oneDNN's
memory, the CPU layout). The one list of network names; MXNet-free, so the configuration
(sample_fc.config) reads presets and a family's training recipe here without building anything.

A family file (iresnet.py, mobilefacenet.py, vit.py) builds a descriptor (network.Network) for
each entry of its family: a network of an existing family is one line here.
"""
from typing import NamedTuple, Optional

# a network's preset (the configuration applies it before the dataset's): arcface_torch's 512-d
# embedding, no dropout, float32 (fp16=true on GPUs with tensor cores), 128 images per worker
# (arcface_torch's 128 x 8 GPUs)
PRESET = {'embedding_size': 512, 'dropout': 0.0, 'fp16': False, 'batch_size': 128}


class Entry(NamedTuple):
    family: str                      # iresnet | mobilefacenet | vit: the file in symbols/ that builds it
    shape: tuple                     # IResNet: units per stage; MobileFaceNet: (blocks, scale);
                                     # ViT: (width, depth, drop path rate, arcface_torch's mask ratio)
    preset: dict = {}                # changes to PRESET
    onednn_extra: Optional[float] = None    # oneDNN's measured memory share above MXNet's plan
                                            # (run/backbone_memory.py); None: not measured


ENTRIES = {
    # IResNets, as arcface_torch's iresnet18 ... iresnet200
    'r18': Entry('iresnet', (2, 2, 2, 2), onednn_extra=0.50),
    'r34': Entry('iresnet', (3, 4, 6, 3), onednn_extra=0.50),
    'r50': Entry('iresnet', (3, 4, 14, 3), onednn_extra=0.50),
    'r100': Entry('iresnet', (3, 13, 30, 3), {'batch_size': 64}, 0.50),    # the Partial FC MXNet default batch
    'r200': Entry('iresnet', (6, 26, 60, 6), {'batch_size': 64}, 0.50),    # ~2x r100's activations
    # MobileFaceNets: 'mbf' is arcface_torch's get_mbf (the paper's blocks at twice the widths),
    # 'mbf_large' its get_mbf_large, 'mbf_small' the paper's network (sample_fc's 'mbf' before)
    'mbf': Entry('mobilefacenet', ((1, 4, 6, 2), 2), onednn_extra=0.70),
    'mbf_large': Entry('mobilefacenet', ((2, 8, 12, 4), 4), onednn_extra=0.80),
    'mbf_small': Entry('mobilefacenet', ((1, 4, 6, 2), 1), onednn_extra=0.80),
    # arcface_torch's Vision Transformers (float32 only; drop path inside, no dropout before the embedding)
    'vit_t': Entry('vit', (256, 12, 0.1, 0.1)),
    'vit_t_dp005_mask0': Entry('vit', (256, 12, 0.05, 0.0)),
    'vit_s': Entry('vit', (512, 12, 0.1, 0.1)),
    'vit_s_dp005_mask_0': Entry('vit', (512, 12, 0.05, 0.0)),
    'vit_b': Entry('vit', (512, 24, 0.1, 0.1)),
    'vit_b_dp005_mask_005': Entry('vit', (512, 24, 0.05, 0.05)),
    'vit_l_dp005_mask_005': Entry('vit', (768, 24, 0.05, 0.05)),
}
NETWORKS = tuple(ENTRIES)

# The CPU layouts measured (run/layout.py chooses by them): bench.step_breakdown --worlds 1,2 on
# 2026-11-27 (BENCHMARKS.md, "The CPU layout"), global samples/s of 1 and of 2 workers sharing a
# node's cores at the same global batch.
class MeasuredLayout(NamedTuple):
    network: str
    image_size: int
    cores: int
    samples_per_s: dict              # workers -> global samples/s (cores // workers threads each)
    source: str                      # where the numbers are

    @property
    def workers(self):
        """The worker count measured fastest."""
        return max(self.samples_per_s, key=self.samples_per_s.get)


MEASURED_LAYOUTS = (
    MeasuredLayout('mbf', 32, 2, {2: 326.0, 1: 292.0}, "BENCHMARKS.md; step_breakdown, global batch 128"),
    MeasuredLayout('mbf', 112, 2, {2: 28.6, 1: 22.6}, "BENCHMARKS.md; step_breakdown, global batch 128"),
    MeasuredLayout('r50', 112, 2, {2: 4.54, 1: 4.84}, "BENCHMARKS.md; step_breakdown, global batch 64"),
)
DEFAULT_NETWORK = 'mbf'          # the base config's network (arcface_torch's MobileFaceNet)
CPU_NETWORK = 'mbf_small'        # the demo's and your own set's (dataset custom): minutes on 2 CPU cores

# Network names whose meaning changed: saved name -> (the stem conv's channel count of the
# network the name meant then, its name now). 'mbf' was the MobileFaceNet paper's network
# (stem 64 channels) until it became arcface_torch's mbf at twice the widths (stem 128).
RENAMED_NETWORKS = {'mbf': (64, 'mbf_small')}

# A family's training recipe, which the configuration applies after the dataset preset. The ViTs:
# arcface_torch's (configs wf42m_pfc*_vit_*): AdamW on the backbone at lr 1e-3 (not scaled by the
# batch: arcface_torch keeps it from 2,048 to 24,576 images a step), weight decay 0.1 decoupled
# and on every parameter, a linear warm-up over the first tenth of the steps then the polynomial
# decay, and CosFace's margin 0.4 (`margin_loss`) where the dataset has no margin of its own.
# The bank keeps SGD with the dataset's lr and weight decay (bank_lr, bank_wd).
FAMILY_RECIPES = {
    'vit': {'keys': {'optimizer': 'adamw', 'lr': 0.001, 'wd': 0.1, 'decay_all': True, 'lr_schedule': 'poly',
                     'warmup_steps': '10%'},
            'margin_loss': 'cosface'},
}


def preset(name):
    """The preset of network `name` (PRESET with its entry's changes); KeyError for another name."""
    return {**PRESET, **ENTRIES[name].preset}


def of_family(family):
    """{name: Entry} of a family, in the catalog's order."""
    return {name: entry for name, entry in ENTRIES.items() if entry.family == family}


def recipe(name):
    """The training recipe of network `name`'s family ({'keys': ..., 'margin_loss': ...}), or None."""
    return FAMILY_RECIPES.get(ENTRIES[name].family)
