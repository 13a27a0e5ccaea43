"""Backbone symbols: get_symbol(name, ...) -> mx.sym.Symbol with input `data` and a
single output `embeddings` (N, embedding_size).

Networks: 'r18', 'r34', 'r50', 'r100', 'r200' (IResNet, symbols/iresnet.py) and 'mbf',
'mbf_large', 'mbf_small' (MobileFaceNet, symbols/mobilefacenet.py), named as insightface's
arcface_torch names them: 'mbf' is the paper's network at twice its widths (get_mbf),
'mbf_large' blocks (2, 8, 12, 4) at four times the widths (get_mbf_large), 'mbf_small' the
paper's network itself (sample_fc's 'mbf' before; the demo trains it); 'vit_t', 'vit_s', 'vit_b' and
arcface_torch's WebFace42M variants (Vision Transformers, symbols/vit.py). The symbols
take raw RGB pixels 0..255, as the data iterators deliver them, and normalise them in the
graph to (x - 127.5) / 128.
"""
import importlib

from .catalog import NETWORKS
from .network import Network, UnknownNetwork

FAMILY_FILES = ('iresnet', 'mobilefacenet', 'vit')   # a new family of networks: its file in symbols/, named here
_FROM_COMMON = {'with_frozen_batchnorm', 'with_learned_embedding_scale'}      # need MXNet: read on first use

__all__ = ['FAMILIES', 'NETWORKS', 'Network', 'UnknownNetwork', 'get_symbol', 'network', 'with_frozen_batchnorm',
           'with_learned_embedding_scale']
_NETWORKS = {}          # name -> Network, filled from the family files on first use (they import MXNet)


def _descriptors():
    if not _NETWORKS:
        for family in __getattr__('FAMILIES'):
            _NETWORKS.update(family.NETWORKS)
    return _NETWORKS


def __getattr__(name):
    """The parts that import MXNet (the family files, common.py's symbol rewrites), on first use:
    `sample_fc.symbols` and its catalog stay MXNet-free for the configuration."""
    if name == 'FAMILIES':
        return tuple(importlib.import_module(f'.{family}', __name__) for family in FAMILY_FILES)
    if name in _FROM_COMMON:
        return getattr(importlib.import_module('.common', __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def network(name):
    """The Network descriptor of `name`; UnknownNetwork (a ValueError naming the choices) for
    any other name."""
    if name not in NETWORKS:
        raise UnknownNetwork('unknown network %r; valid choices: %s' % (name, ', '.join(NETWORKS)))
    return _descriptors()[name]


def get_symbol(name, embedding_size=512, image_size=112, dtype='float32', dropout=0.0):
    """Build backbone `name` (one of NETWORKS).

    embedding_size: width D of the output `embeddings` (N, D).
    image_size:     side of the square input (N, 3, image_size, image_size); a positive
                    multiple of 16 (both backbones downsample by 16: 112 -> 7x7).
    dtype:          'float32' or 'float16'; a float16 backbone casts `data` to fp16 and
                    its features back to fp32 before the embedding layer, so the
                    output is float32 either way.
    dropout:        drop probability in [0, 1) just before the embedding layer.
    Raises ValueError naming the bad value and the valid choices.
    """
    return network(name).symbol(embedding_size, image_size, dtype, dropout)
