"""Small data files in each format the readers take (IDX, CIFAR-10 pickles, an image tree), written by the tests."""

from __future__ import annotations

import gzip
import os
import pickle
from collections.abc import Sequence

import numpy as np

from harness.data.builtin import load_digits


def write_idx(path: str, array: np.ndarray, gz: bool = False) -> None:
    """An IDX file of unsigned bytes, as in yann.lecun.com/exdb/mnist/."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with (gzip.open if gz else open)(path, "wb") as handle:
        handle.write(payload)


def write_mnist(
    data_dir: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    folder: str = "MNIST",
    gz: bool = False,
) -> str:
    """torchvision's MNIST raw layout: images [N, H, W] and labels [N] per split; returns the raw dir."""
    raw = os.path.join(data_dir, folder, "raw")
    for prefix, (images, labels) in (("train", train), ("t10k", test)):
        suffix = ".gz" if gz else ""
        write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte{suffix}"), images, gz)
        write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte{suffix}"), labels, gz)
    return raw


def write_digits_as_mnist(data_dir: str, test_size: int = 101, folder: str = "MNIST") -> None:
    """The embedded digits (learnable, 28x28) in MNIST's IDX layout; test_size is prime, so it never splits evenly."""
    train, test = load_digits("train"), load_digits("test")
    write_mnist(
        data_dir, (train.images[:, 0], train.labels), (test.images[:test_size, 0], test.labels[:test_size]), folder
    )


def random_mnist(data_dir: str, train_size: int, test_size: int, seed: int = 0, **kwargs) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {
        "train_images": rng.integers(0, 256, (train_size, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, train_size, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (test_size, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, test_size, dtype=np.uint8),
    }
    write_mnist(
        data_dir,
        (arrays["train_images"], arrays["train_labels"]),
        (arrays["test_images"], arrays["test_labels"]),
        **kwargs,
    )
    return arrays


def write_cifar10(data_dir: str, per_batch: int = 7, seed: int = 0) -> dict[str, np.ndarray]:
    """torchvision's cifar-10-batches-py layout with `per_batch` images per file (5 train files, 1 test)."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(data_dir, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    out: dict[str, list] = {"train_images": [], "train_labels": [], "test_images": [], "test_labels": []}
    for index, file in enumerate([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]):
        data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, per_batch).tolist()
        # The real files are Python 2 pickles; keys come back as str or bytes depending on the reader.
        entry = {b"data": data, b"labels": labels} if index % 2 else {"data": data, "labels": labels}
        with open(os.path.join(folder, file), "wb") as handle:
            pickle.dump(entry, handle, protocol=2)
        split = "test" if file == "test_batch" else "train"
        out[f"{split}_images"].append(data.reshape(-1, 3, 32, 32))
        out[f"{split}_labels"].append(np.asarray(labels))
    return {key: np.concatenate(value) for key, value in out.items()}


def write_image_tree(
    root: str, classes: Sequence[str], per_class: int, size: tuple[int, int] = (24, 20), suffix: str = ".png"
) -> None:
    """ROOT/<class>/<i><suffix>: class k's images are a flat colour with red = 40 * k."""
    from PIL import Image

    for label, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            Image.new("RGB", size, (40 * label, 10 * i, 200)).save(os.path.join(root, name, f"{i}{suffix}"))


# -- IDX ------------------------------------------------------------------------------------------
