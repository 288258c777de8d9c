"""The built-in task `images`: the workshop CNN or a torchvision ResNet classifying one of the kit's
image datasets (harness.data), with cross-entropy, accuracy, and normalisation (and the optional
CIFAR augmentation) done to the whole batch on the device.

It is a task like any researcher's (harness.tasks.task.Task), built by a factory that takes keyword
arguments; its Options dataclass declares them as the `harness train` flags --model, --dataset,
--data-dir, --image-size, --augment and --dropout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..config import DATA_DIR, IMAGE_SIZE
from ..data import DATASETS, DataOptions, ImageArrays, Normaliser, load_split
from ..data.transforms import RandomCropFlip
from ..errors import UsageError, unknown_choice
from ..options import BaseOptions, option
from .models import MODELS, build_model
from .task import BatchContext, BuiltinTask, Task

PREPARE_WAIT_S = 3600.0  # how long a rank waits for another that prepares the same on-disk dataset


@dataclass(frozen=True)
class ImageOptions(BaseOptions):
    """The `images` task's arguments (each a `harness train` flag)."""

    model: str = option("cnn", "--model", "images: cnn (workshop CNN), resnet18 or resnet50")
    dataset: str = option(
        "digits",
        "--dataset",
        "images: digits (embedded, offline), synthetic, mnist, fashion-mnist, cifar10, imagefolder",
    )
    data_dir: str = option(DATA_DIR, "--data-dir", "images: directory holding on-disk datasets (see `harness data`)")
    image_size: int = option(
        IMAGE_SIZE,
        "--image-size",
        "images: imagefolder's side in pixels, images resized and centre-cropped to it when prepared",
    )
    augment: bool = option(
        False,
        "--augment",
        "images: random crop (4-pixel padding) and horizontal flip of training batches, the CIFAR recipe; "
        "drawn from (seed, epoch, step)",
    )
    dropout: Optional[float] = option(
        None, "--dropout", "images: both CNN dropout rates (0 turns dropout off; default 0.25 and 0.5)", type=float
    )

    def validate(self) -> None:
        for kind, value, known in (("model", self.model, MODELS), ("dataset", self.dataset, DATASETS)):
            if value not in known:
                raise unknown_choice(kind, value, known)
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise UsageError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.image_size <= 0:
            raise UsageError(f"--image-size must be a positive integer, got {self.image_size}")


class ImagePreparation:
    """uint8 images on the device -> augmented (training, optional) and normalised float images."""

    def __init__(self, mean: Any, std: Any, augment: bool) -> None:
        self.mean, self.std, self.augment = mean, std, augment
        self._normalisers: dict[torch.device, Normaliser] = {}

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor], context: BatchContext) -> Any:
        images, labels = batch
        if self.augment and context.training:
            crop_flip = RandomCropFlip(context.seed, context.rank, context.world_size, context.local_batch)
            images = crop_flip(images, context.epoch, context.step)
        normalise = self._normalisers.get(images.device)
        if normalise is None:
            normalise = self._normalisers[images.device] = Normaliser(self.mean, self.std, images.device)
        return normalise(images), labels


def classification_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def classification_scores(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, tuple]:
    """Loss and accuracy as sums over the batch, from one forward pass."""
    images, labels = batch
    logits = model(images).float()
    return {
        "loss": (F.cross_entropy(logits, labels, reduction="sum"), labels.numel()),
        "accuracy": ((logits.argmax(dim=1) == labels).sum(), labels.numel()),
    }


def image_task(**arguments: Any) -> Task:
    """The built-in image classification task with these ImageOptions (by field name)."""
    options = ImageOptions.parse("task 'images'", arguments)
    loading = DataOptions(options.data_dir, options.model, options.image_size, PREPARE_WAIT_S)
    train: ImageArrays = load_split(options.dataset, "train", loading)
    test: ImageArrays = load_split(options.dataset, "test", loading)
    channels, size, _ = train.shape

    def make_model() -> nn.Module:
        return build_model(options.model, channels, size, train.num_classes, options.dropout)

    return Task(
        build_model=make_model,
        train_data=train,
        test_data=test,
        loss=classification_loss,
        metrics=classification_scores,
        prepare_batch=ImagePreparation(train.mean, train.std, options.augment),
        name="images",
        description={
            "model": options.model,
            "data": options.dataset,
            "samples": f"{channels}x{size}x{size} uint8 images, {train.num_classes} classes",
        },
    )


IMAGES = BuiltinTask("images", image_task, ImageOptions, "a CNN or ResNet classifying one of the kit's image datasets")
