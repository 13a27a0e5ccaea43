"""One descriptor per backbone: everything the toolkit knows about a network, found by its name.

A family file of symbols/ (iresnet.py, mobilefacenet.py, vit.py) builds `NETWORKS = {name:
Network(...)}` for its entries of catalog.py; symbols/__init__.py gathers the families (FAMILIES,
on first use) and `network(name)`
returns the descriptor, or raises UnknownNetwork (a ValueError naming the valid choices) for a
name none of them holds: no caller falls back to another network.
"""
from dataclasses import dataclass
from typing import Callable, Optional

# arcface_torch's initialisation of a family's weights (sample_fc.initializers: its Initializer)
TORCH_INITS = ("conv_normal_fc_uniform", "fan_out_normal", "vit_trunc_normal")


class UnknownNetwork(ValueError):
    """A network name no family of symbols/ holds."""


@dataclass(frozen=True)
class Network:
    name: str
    family: str                   # the family file's name: 'iresnet', 'mobilefacenet', 'vit'
    shape: tuple                  # the family's parameters (IResNet: units per stage; MobileFaceNet: (blocks, scale);
                                  # ViT: (width, depth, drop path rate, arcface_torch's mask ratio))
    build: Callable               # (name, embedding_size, image_size, dtype, dropout) -> mx.sym.Symbol
    torch_layers: Callable        # (name) -> [(our layer, its arcface_torch module, kind of parameters)]
    torch_init: str               # arcface_torch's initialisation, one of TORCH_INITS
    onednn_extra: Optional[float] = None   # oneDNN's measured memory share above MXNet's plan
                                           # (run/backbone_memory.py; None: not measured, the largest)

    def symbol(self, embedding_size=512, image_size=112, dtype='float32', dropout=0.0):
        """The backbone's symbol: input `data` (N, 3, image_size, image_size) raw RGB pixels,
        output `embeddings` (N, embedding_size)."""
        return self.build(self.name, embedding_size, image_size, dtype, dropout)

    def arcface_torch_layers(self):
        """[(our layer, its arcface_torch module, kind)] in order (models/torch_backbone.py)."""
        return self.torch_layers(self.name)
