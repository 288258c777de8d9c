"""Datasets by name. Training never downloads: on-disk datasets are read from --data-dir."""

from __future__ import annotations

from typing import Callable, Dict

from ..errors import UsageError
from .arrays import ImageArrays, Normaliser
from .builtin import load_digits, load_synthetic

# name -> loader(split, data_dir, model) for split in {"train", "test"}
DATASETS: Dict[str, Callable[[str, str, str], ImageArrays]] = {
    "digits": lambda split, data_dir, model: load_digits(split),
    "synthetic": lambda split, data_dir, model: load_synthetic(split, model),
}


def load_split(name: str, split: str, data_dir: str, model: str) -> ImageArrays:
    """One split ("train" or "test") of dataset `name`, decoded and ready to index."""
    if name not in DATASETS:
        raise UsageError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name](split, data_dir, model)


__all__ = ["DATASETS", "ImageArrays", "Normaliser", "load_split"]
