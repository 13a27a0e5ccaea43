"""Embeddings of a verification set's images by the yardstick's backbone (bench.compare scores
them with sample_fc.verification.score, the same 10-fold verification as sample_fc's side).

Images come as .bin files hold them (RGB pixels 0..255, NHWC) and are normalised by the
yardstick's data path's own function (data.normalised); each embedding is
the image's plus its mirror's, as sample_fc's Embedder does with flip on.
"""
import numpy as np
import torch

from .data import normalised


def embed_pairs(backbone, images_nhwc, batch_size=128):
    """(N, D) float32 flip-summed embeddings of uint8 RGB images, the backbone in eval mode
    (its training mode is restored after)."""
    was_training = backbone.training
    backbone.eval()
    parts = []
    with torch.no_grad():
        for start in range(0, len(images_nhwc), batch_size):
            pixels = normalised(images_nhwc[start:start + batch_size])
            parts.append((backbone(pixels) + backbone(pixels.flip(3))).numpy())
    backbone.train(was_training)
    return np.concatenate(parts)
