"""Data layer: any data with a length and a fetch by indices, sharded exactly per rank and batched;
and the kit's own image datasets by name.

- `indexed`, `batches`, `sharding`, `loader`: what any task's data goes through: IndexedData (a
  map-style Dataset is adapted), a batch as any structure of tensors, each rank's exact share of
  every epoch, and the batches fetched in-process or by worker processes;
- `arrays`, `builtin`, `disk`, `readers`, `prepare`, `download`, `transforms`: the image datasets
  the built-in `images` task trains on (harness.tasks.images);
- `tokens`: the token windows the built-in `transformer` task trains on (harness.tasks.transformer):
  the Python standard library's source as bytes, prepared once (`prepare`), or synthetic tokens.

Training never downloads: on-disk datasets are read from --data-dir. `digits` and `synthetic` need no files. `mnist`, `fashion-mnist`, `cifar10` and `imagefolder` are
read from --data-dir in torchvision's layout (see `disk`), fetched beforehand with `harness data
download` where there is a downloader, converted once to memory-mapped uint8 arrays (see `prepare`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError
from .arrays import ImageArrays, Normaliser
from .builtin import load_digits, load_synthetic
from .disk import DISK_DATASETS, DiskDataset
from .prepare import ensure_prepared, open_prepared
from .sharding import epoch_permutation, eval_range, rank_slice, steps_per_epoch


@dataclass(frozen=True)
class DataOptions:
    """What loading a dataset may depend on besides its name and split."""

    data_dir: str
    model: str  # synthetic data takes the model's input shape
    image_size: int  # imagefolder images are resized to this when prepared
    prepare_timeout: float  # seconds to wait for another process that is preparing the same dataset


def _prepared(spec: DiskDataset) -> Callable[[str, DataOptions], ImageArrays]:
    def load(split: str, options: DataOptions) -> ImageArrays:
        directory, _ = ensure_prepared(spec, options.data_dir, options.image_size, options.prepare_timeout)
        return open_prepared(directory, split, spec, options.data_dir, options.image_size)

    return load


# name -> loader(split, options) for split in {"train", "test"}
DATASETS: dict[str, Callable[[str, DataOptions], ImageArrays]] = {
    "digits": lambda split, options: load_digits(split),
    "synthetic": lambda split, options: load_synthetic(split, options.model),
    **{name: _prepared(spec) for name, spec in DISK_DATASETS.items()},
}


def load_split(name: str, split: str, options: DataOptions) -> ImageArrays:
    """One split ("train" or "test") of dataset `name`, decoded (or memory-mapped) and ready to index.

    An on-disk dataset is prepared first if it has not been, by one process per filesystem.
    """
    if name not in DATASETS:
        raise UsageError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[name](split, options)


def prepare_dataset(name: str, data_dir: str, image_size: int, timeout: float) -> tuple[str, bool]:
    """`harness data prepare`: (directory of the prepared arrays, whether this call wrote them)."""
    if name not in DISK_DATASETS:
        known = ", ".join(DISK_DATASETS)
        raise UsageError(
            f"{name!r} is not a dataset read from --data-dir; choose one of {known}"
            if name not in DATASETS
            else f"{name} needs no preparing; choose one of {known}"
        )
    return ensure_prepared(DISK_DATASETS[name], data_dir, image_size, timeout)


__all__ = [
    "DATASETS",
    "DataOptions",
    "ImageArrays",
    "Normaliser",
    "epoch_permutation",
    "eval_range",
    "load_split",
    "prepare_dataset",
    "rank_slice",
    "steps_per_epoch",
]
