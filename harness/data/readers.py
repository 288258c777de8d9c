"""Readers for the on-disk layouts torchvision downloads, decoding each split to uint8 [N, C, H, W].

They run once, when a dataset is prepared (see `prepare`); training reads the prepared arrays.
Every problem with the input (a missing file, a truncated or corrupt one, an empty image tree)
raises UsageError naming the file and the fix, never a traceback from deep inside a decoder.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
from collections.abc import Sequence
from typing import Optional

import numpy as np

from ..errors import UsageError

# IDX type codes (http://yann.lecun.com/exdb/mnist/): only unsigned bytes occur in MNIST-like sets.
IDX_UBYTE = 0x08
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".gif", ".tif", ".tiff", ".webp")


def download_hint(name: str, data_dir: str) -> str:
    """The command that fetches dataset `name` into `data_dir` (on a machine with internet access)."""
    return f"`harness data download {name} --data-dir {data_dir}` on a machine with internet access (a login node)"


def missing_file_error(name: str, path: str, data_dir: str) -> UsageError:
    """The one-line error for an expected input that is not there."""
    return UsageError(f"{name}: expected {path}, which does not exist; fetch it with {download_hint(name, data_dir)}")


def _corrupt(name: str, path: str, what: str, data_dir: str) -> UsageError:
    return UsageError(f"{name}: {path} is {what}; delete it and fetch it again with {download_hint(name, data_dir)}")


# -- IDX (MNIST, Fashion-MNIST) ---------------------------------------------------------------


def find_idx(raw_dir: str, stem: str) -> Optional[str]:
    """The IDX file `stem` in raw_dir, extracted or still gzipped (torchvision keeps both)."""
    for candidate in (stem, stem + ".gz"):
        path = os.path.join(raw_dir, candidate)
        if os.path.exists(path):
            return path
    return None


def read_idx(path: str, name: str, data_dir: str) -> np.ndarray:
    """An IDX file of unsigned bytes as an array of its declared shape; rejects truncated files."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                payload = handle.read()
        else:
            with open(path, "rb") as handle:
                payload = handle.read()
    except (OSError, EOFError) as exc:  # gzip raises these for truncated or non-gzip data
        raise _corrupt(name, path, f"unreadable ({exc})", data_dir) from exc
    if len(payload) < 4 or payload[0] != 0 or payload[1] != 0:
        raise _corrupt(name, path, "not an IDX file (bad magic number)", data_dir)
    type_code, ndim = payload[2], payload[3]
    if type_code != IDX_UBYTE or ndim == 0:
        raise _corrupt(
            name, path, f"an IDX file of type 0x{type_code:02x} with {ndim} dimensions, not unsigned bytes", data_dir
        )
    header = 4 + 4 * ndim
    if len(payload) < header:
        raise _corrupt(name, path, "truncated (incomplete header)", data_dir)
    shape = tuple(int(d) for d in np.frombuffer(payload, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape))
    if len(payload) != expected:
        state = "truncated" if len(payload) < expected else "longer than its header says"
        raise _corrupt(name, path, f"{state} ({len(payload)} bytes, expected {expected} for shape {shape})", data_dir)
    return np.frombuffer(payload, dtype=np.uint8, offset=header).reshape(shape)


def read_idx_split(name: str, raw_dir: str, split: str, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 1, H, W], labels int64 [N]) of torchvision's MNIST raw files for `split`."""
    prefix = "train" if split == "train" else "t10k"
    arrays = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        stem = f"{prefix}-{kind}"
        path = find_idx(raw_dir, stem)
        if path is None:
            raise missing_file_error(name, os.path.join(raw_dir, stem), data_dir)
        arrays.append((path, read_idx(path, name, data_dir)))
    (image_path, images), (label_path, labels) = arrays
    if images.ndim != 3:
        raise _corrupt(name, image_path, f"an IDX array of shape {images.shape}, not [N, height, width]", data_dir)
    if labels.ndim != 1 or len(labels) != len(images):
        raise _corrupt(name, label_path, f"{labels.shape[0]} labels for {len(images)} images", data_dir)
    return images[:, None, :, :].copy(), labels.astype(np.int64)


# -- CIFAR-10 python pickles -----------------------------------------------------------------


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain containers and numpy arrays only: a data file must not run arbitrary code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):  # type: ignore[override]
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _text_keys(entry: dict) -> dict:
    return {(key.decode("latin1") if isinstance(key, bytes) else key): value for key, value in entry.items()}


def read_cifar_batch(path: str, name: str, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 3, 32, 32], labels int64 [N]) of one CIFAR-10 python batch file."""
    if not os.path.exists(path):
        raise missing_file_error(name, path, data_dir)
    try:
        with open(path, "rb") as handle:
            entry = _ArrayUnpickler(io.BytesIO(handle.read()), encoding="latin1").load()
        entry = _text_keys(entry)
        data = np.asarray(entry["data"], dtype=np.uint8)
        labels = np.asarray(entry.get("labels", entry.get("fine_labels")), dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise _corrupt(name, path, f"not a CIFAR python batch ({type(exc).__name__}: {exc})", data_dir) from exc
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
        raise _corrupt(
            name,
            path,
            f"a batch of shape {data.shape} with {labels.size} labels, not [N, 3072] with N labels",
            data_dir,
        )
    return data.reshape(-1, 3, 32, 32), labels


CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_FILES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}


def read_cifar10_split(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """A CIFAR-10 split from torchvision's `cifar-10-batches-py` folder."""
    parts = [
        read_cifar_batch(os.path.join(data_dir, CIFAR10_FOLDER, file), "cifar10", data_dir)
        for file in CIFAR10_FILES[split]
    ]
    labels = np.concatenate([labels for _, labels in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= 10):
        raise UsageError(
            f"cifar10: labels under {os.path.join(data_dir, CIFAR10_FOLDER)} fall outside 0-9; "
            f"fetch the set again with {download_hint('cifar10', data_dir)}"
        )
    return np.concatenate([images for images, _ in parts]), labels


# -- ImageNet-style tree: ROOT/<split>/<class>/<image> ----------------------------------------


def scan_image_tree(root: str, classes: Optional[Sequence[str]] = None) -> tuple[list[str], np.ndarray, list[str]]:
    """(image paths, labels, class names) of a class-per-directory tree, in sorted order.

    `classes` fixes the label of each class name (the training split's); a class directory that is
    not among them is an error, since the model has no output for it.
    """
    if not os.path.isdir(root):
        raise UsageError(
            f"imagefolder: expected a directory {root} holding one sub-directory per class; "
            "create it (imagefolder has no download)"
        )
    found = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    names = list(classes) if classes is not None else found
    unknown = sorted(set(found) - set(names))
    if unknown:
        raise UsageError(
            f"imagefolder: {root} has classes {unknown[:5]} that the training split lacks; "
            "give both splits the same class directories"
        )
    label_of = {name: label for label, name in enumerate(names)}
    paths: list[str] = []
    labels: list[int] = []
    for name in found:
        for directory, subdirs, files in os.walk(os.path.join(root, name)):
            subdirs.sort()
            for file in sorted(files):
                if file.lower().endswith(IMAGE_SUFFIXES) and not file.startswith("."):
                    paths.append(os.path.join(directory, file))
                    labels.append(label_of[name])
    if not paths:
        raise UsageError(
            f"imagefolder: no images under {root}; expected {root}/<class>/<image> "
            f"with suffix {', '.join(IMAGE_SUFFIXES[:3])}, ..."
        )
    return paths, np.asarray(labels, dtype=np.int64), names


def decode_image(path: str, size: int) -> np.ndarray:
    """One image as uint8 [3, size, size]: shorter side resized to `size`, then centre-cropped."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image = image.convert("RGB")
            width, height = image.size
            scale = size / min(width, height)
            resized = image.resize(
                (max(size, round(width * scale)), max(size, round(height * scale))), Image.Resampling.BILINEAR
            )
            left, top = (resized.width - size) // 2, (resized.height - size) // 2
            pixels = np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
        raise UsageError(f"imagefolder: cannot decode {path} ({exc}); remove or replace the file") from exc
    return pixels.transpose(2, 0, 1)
