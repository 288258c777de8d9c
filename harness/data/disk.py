"""The datasets read from --data-dir: where their files lie and how each split is decoded.

Raw layouts are torchvision's, so `harness data download` (torchvision's downloaders) and a copy
fetched by hand both work:

- mnist:         DATA/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
- fashion-mnist: DATA/FashionMNIST/raw/ (the same four IDX files)
- cifar10:       DATA/cifar-10-batches-py/{data_batch_1..5,test_batch}
- imagefolder:   DATA/train/<class>/<image> and DATA/val/<class>/<image> (or DATA/test/...)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import UsageError
from .readers import decode_image, read_cifar10_split, read_idx_split, scan_image_tree

CHUNK = 4096  # images per chunk handed to the writer (bounds memory while preparing)


@dataclass
class SplitSource:
    """One split, ready to be written: its size, image shape, image chunks in order, and labels."""

    count: int
    shape: tuple[int, int, int]
    chunks: Iterable[np.ndarray]  # uint8 [n, C, H, W] pieces that add up to `count` images
    labels: np.ndarray


def _in_memory(images: np.ndarray, labels: np.ndarray) -> SplitSource:
    chunks = (images[start : start + CHUNK] for start in range(0, len(images), CHUNK))
    return SplitSource(len(images), tuple(images.shape[1:]), chunks, labels)


@dataclass(frozen=True)
class DiskDataset:
    """A dataset in --data-dir: `read(data_dir, image_size)` gives its splits and class names."""

    name: str
    read: Callable[[str, int], tuple[dict[str, SplitSource], list[str]]]
    torchvision_class: Optional[str]  # the torchvision.datasets class that downloads it (None: no download)
    resized: bool = False  # images are resized to --image-size when prepared, so it is part of the name

    def prepared_name(self, image_size: int) -> str:
        """Directory name of the prepared arrays under DATA/prepared/."""
        return f"{self.name}-{image_size}px" if self.resized else self.name


def _idx_dataset(name: str, torchvision_class: str, classes: list[str]) -> DiskDataset:
    def read(data_dir: str, image_size: int) -> tuple[dict[str, SplitSource], list[str]]:
        raw = os.path.join(data_dir, torchvision_class, "raw")  # where torchvision's downloader puts them
        splits = {split: _in_memory(*read_idx_split(name, raw, split, data_dir)) for split in ("train", "test")}
        return splits, classes

    return DiskDataset(name, read, torchvision_class)


def _read_cifar10(data_dir: str, image_size: int) -> tuple[dict[str, SplitSource], list[str]]:
    return {split: _in_memory(*read_cifar10_split(data_dir, split)) for split in ("train", "test")}, CIFAR10_CLASSES


IMAGEFOLDER_TEST_DIRS = ("val", "test")  # ImageNet calls its held-out split `val`


def _read_imagefolder(data_dir: str, image_size: int) -> tuple[dict[str, SplitSource], list[str]]:
    train_paths, train_labels, classes = scan_image_tree(os.path.join(data_dir, "train"))
    test_root = next(
        (os.path.join(data_dir, d) for d in IMAGEFOLDER_TEST_DIRS if os.path.isdir(os.path.join(data_dir, d))), None
    )
    if test_root is None:
        raise UsageError(
            f"imagefolder: expected {os.path.join(data_dir, 'val')} (or .../test) holding "
            "<class>/<image> for evaluation; create it beside train/"
        )
    test_paths, test_labels, _ = scan_image_tree(test_root, classes)
    shape = (3, image_size, image_size)

    def decoded(paths: list[str]) -> Iterable[np.ndarray]:
        # One image at a time: a large tree streams into the memory-mapped output.
        return (decode_image(path, image_size)[None] for path in paths)

    return {
        "train": SplitSource(len(train_paths), shape, decoded(train_paths), train_labels),
        "test": SplitSource(len(test_paths), shape, decoded(test_paths), test_labels),
    }, classes


MNIST_CLASSES = [str(digit) for digit in range(10)]
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

DISK_DATASETS: dict[str, DiskDataset] = {
    spec.name: spec
    for spec in (
        _idx_dataset("mnist", "MNIST", MNIST_CLASSES),
        _idx_dataset("fashion-mnist", "FashionMNIST", FASHION_MNIST_CLASSES),
        DiskDataset("cifar10", _read_cifar10, "CIFAR10"),
        DiskDataset("imagefolder", _read_imagefolder, None, resized=True),
    )
}
