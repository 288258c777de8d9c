"""Datasets that need no files: `digits` (real handwriting shipped by scikit-learn) and `synthetic`."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import require
from .arrays import ImageArrays

DIGITS_TEST_SIZE = 297  # of 1,797: leaves 1,500 training images; 297 is odd so eval shards are uneven
DIGITS_SPLIT_SEED = 1797
SYNTHETIC_POOL = 512  # distinct random images; indices beyond wrap around
SYNTHETIC_LENGTH = {"train": 60_000, "test": 2_000}


def _read_digits_csv() -> np.ndarray:
    # Read scikit-learn's bundled file directly: importing sklearn (and scipy) costs 1-2 s per rank,
    # and importlib.resources.files("sklearn.datasets") would import it; require(load=False) only locates it.
    spec = require("sklearn", "the digits dataset", "pip install scikit-learn (make setup installs it)", load=False)
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    with gzip.open(path, "rt") as text:
        return np.loadtxt(text, delimiter=",", dtype=np.float32)


_DIGITS_CACHE: dict[str, ImageArrays] = {}


def load_digits(split: str) -> ImageArrays:
    """The 1,797 UCI handwritten digits (8x8, 17 grey levels) upsampled to 28x28 uint8, MNIST-like."""
    if not _DIGITS_CACHE:
        table = _read_digits_csv()
        pixels = torch.from_numpy(table[:, :64].reshape(-1, 1, 8, 8) / 16.0)
        images = F.interpolate(pixels, size=(28, 28), mode="bilinear", align_corners=False)
        images = (images.clamp(0, 1) * 255).round().to(torch.uint8).numpy()
        labels = table[:, 64].astype(np.int64)
        order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
        test, train = order[:DIGITS_TEST_SIZE], order[DIGITS_TEST_SIZE:]
        mean = float(images[train].mean() / 255)
        std = float(images[train].std() / 255)
        for name, rows in (("train", train), ("test", test)):
            _DIGITS_CACHE[name] = ImageArrays(images[rows], labels[rows], 10, (mean,), (std,))
    return _DIGITS_CACHE[split]


def synthetic_shape(model: str) -> tuple[tuple[int, int, int], int]:
    """Input shape and classes synthetic data takes for `model`: MNIST-like or ImageNet-like."""
    return ((1, 28, 28), 10) if model == "cnn" else ((3, 224, 224), 1000)


def load_synthetic(split: str, model: str) -> ImageArrays:
    """Random uint8 images of the model's input shape, for throughput runs; fixed by the split name."""
    shape, classes = synthetic_shape(model)
    rng = np.random.default_rng(0 if split == "train" else 1)
    images = rng.integers(0, 256, size=(SYNTHETIC_POOL, *shape), dtype=np.uint8)
    labels = rng.integers(0, classes, size=SYNTHETIC_POOL, dtype=np.int64)
    channels = shape[0]
    return ImageArrays(images, labels, classes, (0.5,) * channels, (0.29,) * channels, length=SYNTHETIC_LENGTH[split])
