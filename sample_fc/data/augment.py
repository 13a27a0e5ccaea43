"""Cheap training augmentations for FaceRecordIter, as insightface arcface_torch's DALI pipeline offers.

Each op has its own probability (0 = off): a random down-scale and back (low resolution),
a Gaussian blur, a brightness/contrast/saturation jitter and a grayscale conversion,
applied in that order to uint8 (H, W, 3) RGB pixels. `Augmentation.draw` picks every
image's ops and values up front from a given generator, so the iterator draws a whole
epoch's parameters from (seed, epoch, rank) and the augmented images do not depend on
which decode thread runs when. `augment_image` applies one image's parameters.
"""
from dataclasses import dataclass, fields

import numpy as np
from PIL import Image, ImageFilter

from ..options import is_probability

DOWNSCALE_RANGE = (0.5, 1.0)  # side fraction of the shrunken image, [low, high)
BLUR_RADIUS_RANGE = (0.5, 1.5)  # Gaussian blur radius in pixels
JITTER_RANGE = (0.8, 1.2)  # brightness, contrast and saturation factors
LUMA = np.array([0.299, 0.587, 0.114])  # ITU-R 601 weights of R, G, B

# One image's parameters: whether each op applies, and its random values (drawn either way).
PARAMS = np.dtype([("downscale", "?"), ("fraction", "f8"), ("blur", "?"), ("radius", "f8"),
                   ("jitter", "?"), ("factors", "f8", (3,)), ("grayscale", "?")])


@dataclass(frozen=True)
class Augmentation:
    """Probabilities of the four ops (config keys aug_<field>), each a number in [0, 1]."""
    downscale: float = 0.0
    blur: float = 0.0
    color_jitter: float = 0.0
    grayscale: float = 0.0

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if not is_probability(value):
                raise ValueError(f"aug_{field.name} must be a probability in [0, 1], got {value!r}")

    @property
    def active(self):
        """Whether any op can apply (otherwise images pass through untouched)."""
        return any(getattr(self, field.name) > 0 for field in fields(self))

    def draw(self, rng, n):
        """Parameters of n images (a PARAMS array) from the generator rng. Every value is drawn
        whatever the probabilities, so changing one op's probability leaves the others' picks."""
        params = np.zeros(n, dtype=PARAMS)
        chosen = rng.random((n, 4)) < [self.downscale, self.blur, self.color_jitter, self.grayscale]
        params["downscale"], params["blur"], params["jitter"], params["grayscale"] = chosen.T
        params["fraction"] = rng.uniform(*DOWNSCALE_RANGE, n)
        params["radius"] = rng.uniform(*BLUR_RADIUS_RANGE, n)
        params["factors"] = rng.uniform(*JITTER_RANGE, (n, 3))
        return params


def downscale(pixels, fraction):
    """Shrink to floor(fraction * side) (at least 1 px) and back to the original size, both bilinear."""
    height, width = pixels.shape[:2]
    small = (max(1, int(width * fraction)), max(1, int(height * fraction)))
    image = Image.fromarray(pixels).resize(small, Image.BILINEAR).resize((width, height), Image.BILINEAR)
    return np.asarray(image)


def blur(pixels, radius):
    """Gaussian blur of the given radius in pixels (Pillow)."""
    return np.asarray(Image.fromarray(pixels).filter(ImageFilter.GaussianBlur(radius)))


def color_jitter(pixels, brightness, contrast, saturation):
    """Scale by brightness, blend with the mean gray by contrast and with each pixel's gray by
    saturation (factor 1 keeps, 0 gives the gray); rounded and clipped to uint8."""
    x = pixels.astype(np.float64) * brightness
    mean = (x @ LUMA).mean()
    x = mean + contrast * (x - mean)
    gray = (x @ LUMA)[..., None]
    x = gray + saturation * (x - gray)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def grayscale(pixels):
    """ITU-R 601 luma (rounded), replicated to the three channels."""
    luma = np.clip(np.rint(pixels @ LUMA), 0, 255).astype(np.uint8)
    return np.repeat(luma[..., None], 3, axis=2)


def augment_image(pixels, params):
    """uint8 (H, W, 3) pixels with the ops of one PARAMS row applied (the input itself if none)."""
    if params["downscale"]:
        pixels = downscale(pixels, params["fraction"])
    if params["blur"]:
        pixels = blur(pixels, params["radius"])
    if params["jitter"]:
        pixels = color_jitter(pixels, *params["factors"])
    if params["grayscale"]:
        pixels = grayscale(pixels)
    return pixels
