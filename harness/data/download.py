"""`harness data download`: fetch a dataset with torchvision's downloaders, on a machine online.

Compute nodes are often offline, so training never calls this; run it once on a login node. The
files land in torchvision's layout under --data-dir, which is what the readers expect.
"""

from __future__ import annotations

import os

from ..errors import UsageError
from .disk import DISK_DATASETS


def download(name: str, data_dir: str) -> str:
    """Download dataset `name` into `data_dir` (skipped when torchvision finds it there); return the folder."""
    spec = DISK_DATASETS.get(name)
    if spec is None:
        raise UsageError(
            f"{name!r} is not a dataset read from --data-dir (digits and synthetic need no download); "
            f"choose one of {', '.join(DISK_DATASETS)}"
        )
    if spec.torchvision_class is None:
        raise UsageError(
            f"{name} has no download: put the images in {os.path.join(data_dir, 'train')}/<class>/ "
            f"and {os.path.join(data_dir, 'val')}/<class>/"
        )
    import torchvision.datasets

    dataset_class = getattr(torchvision.datasets, spec.torchvision_class)
    try:
        os.makedirs(data_dir, exist_ok=True)
        for train in (True, False):
            dataset_class(root=data_dir, train=train, download=True)
    except (OSError, RuntimeError) as exc:  # URLError is an OSError; torchvision raises RuntimeError on md5
        reason = " ".join(str(exc).split())[:200]
        raise UsageError(
            f"downloading {name} into {data_dir} failed ({reason}); run this on a machine with "
            "internet access (a login node) and a writable --data-dir"
        ) from exc
    return data_dir
