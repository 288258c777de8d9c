"""The models the harness trains: the workshop CNN and torchvision ResNets (random init)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from ..errors import UsageError

CNN_DROPOUT = (0.25, 0.5)  # the workshop CNN's rates after the conv block and after fc1


class WorkshopCNN(nn.Module):
    """conv32-conv64-maxpool-dropout-fc128-dropout-fc10, the classic MNIST example network; `width`
    and `hidden_layers` widen fc1 and add width x width layers after it (each with a ReLU), for a
    model whose memory matters (the workshop's sharding step)."""

    def __init__(
        self,
        channels: int = 1,
        size: int = 28,
        num_classes: int = 10,
        dropout: Optional[float] = None,
        width: int = 128,
        hidden_layers: int = 0,
    ) -> None:
        super().__init__()
        conv_dropout, fc_dropout = CNN_DROPOUT if dropout is None else (dropout, dropout)
        pooled = (size - 4) // 2  # two 3x3 valid convolutions, then 2x2 max-pooling
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(conv_dropout),
            nn.Flatten(),
        )
        hidden = [layer for _ in range(hidden_layers) for layer in (nn.Linear(width, width), nn.ReLU())]
        self.classifier = nn.Sequential(
            nn.Linear(64 * pooled * pooled, width),
            nn.ReLU(),
            nn.Dropout(fc_dropout),
            *hidden,
            nn.Linear(width, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


def _resnet(factory_name: str) -> Callable[..., nn.Module]:
    def build(channels: int, size: int, num_classes: int, dropout: Optional[float]) -> nn.Module:
        import torchvision

        model = getattr(torchvision.models, factory_name)(weights=None, num_classes=num_classes)
        if channels != 3:  # grayscale digits: a first convolution that takes one channel
            model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return model

    return build


MODELS: dict[str, Callable[..., nn.Module]] = {
    "cnn": lambda channels, size, num_classes, dropout: WorkshopCNN(channels, size, num_classes, dropout),
    "resnet18": _resnet("resnet18"),
    "resnet50": _resnet("resnet50"),
}


def build_model(
    name: str, channels: int, size: int, num_classes: int, dropout: Optional[float] = None, seed: Optional[int] = None
) -> nn.Module:
    """A freshly initialised model for images of `channels` x `size` x `size`, on the CPU.

    With a `seed`, the weights are drawn from a generator seeded with it and torch's global random
    state is left as it was: a model built during a run (a calibration copy)
    must not move the training run's generator, or the next epoch's dropout masks change. The
    initialisation draws only from the CPU generator (the model is built on the CPU), so only that
    one is forked. Without a seed it draws from (and advances) the global generator.
    """
    if name not in MODELS:
        raise UsageError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    if seed is None:
        return MODELS[name](channels, size, num_classes, dropout)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name](channels, size, num_classes, dropout)
