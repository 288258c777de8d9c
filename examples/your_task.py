"""An example task to copy: your own model and data, trained and compared under every backend.

A 1-D convolutional network classifies short noisy signals (sine, square, triangle, sawtooth waves
of random frequency, phase and amplitude), generated here, deterministically, from a fixed data seed:
nothing is downloaded, and every rank builds the same data. Replace the three parts (the data, the
model, the loss and metrics) with yours and keep `make_task`'s shape: keyword arguments in, a
`harness.Task` out.

Run it from the kit's directory, with the kit's environment active (`. .venv/bin/activate`):

    harness train --task examples/your_task.py:make_task --task-arg width=64
    harness launch -n 2 --backend ddp -- --task examples/your_task.py:make_task --task-arg width=64
    harness sweep --task examples/your_task.py:make_task --backends ddp,horovod,deepspeed,fsdp \\
                  --ranks 1,2 --scaling weak --results runs/mine.jsonl

or from Python: `harness.train(harness.TrainConfig(), task="examples/your_task.py:make_task")`.
docs/tutorials/your-model.md walks through it; docs/how-to/your-data.md covers other kinds of data.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from harness import BatchContext, Task

WAVEFORMS = ("sine", "square", "triangle", "sawtooth")  # the classes, in label order
DATA_SEED = 1234  # the data's own seed: the same signals whatever --seed the run trains with


class Signals(Dataset):
    """`count` signals of `length` samples, each one waveform of WAVEFORMS plus Gaussian noise.

    A plain map-style Dataset: `signals[i]` is (a [1, length] float32 signal, its int64 label). The
    kit shards it by index, exactly, and collates a batch from its samples as a DataLoader would."""

    def __init__(self, count: int, length: int, noise: float, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(len(WAVEFORMS), (count,), generator=generator)
        cycles = 2 + 4 * torch.rand(count, 1, generator=generator)  # 2 to 6 periods per signal
        phase = torch.rand(count, 1, generator=generator)
        amplitude = 0.5 + torch.rand(count, 1, generator=generator)
        position = cycles * torch.arange(length) / length + phase  # in periods
        fraction = position % 1
        waves = torch.stack(
            [
                torch.sin(2 * math.pi * position),
                torch.sign(torch.sin(2 * math.pi * position)),
                4 * (fraction - 0.5).abs() - 1,
                2 * fraction - 1,
            ],
            dim=1,
        )  # [count, waveforms, length]
        chosen = waves[torch.arange(count), self.labels]
        noisy = amplitude * chosen + noise * torch.randn(count, length, generator=generator)
        self.signals = noisy.unsqueeze(1).float()  # [count, 1 channel, length]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.signals[index], self.labels[index]


class SignalNet(nn.Module):
    """Three 1-D convolutions, the strongest response of each channel over time, a linear classifier."""

    def __init__(self, width: int, classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, width, kernel_size=7, padding=3),
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size=5, padding=2, stride=2),
            nn.ReLU(),
            nn.Conv1d(width, width, kernel_size=5, padding=2, stride=2),
            nn.ReLU(),
            nn.AdaptiveMaxPool1d(1),
            nn.Flatten(),
        )
        self.classify = nn.Linear(width, classes)

    def forward(self, signals: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(signals))


def classification_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The batch's mean cross-entropy: the kit averages it over ranks as every framework does."""
    signals, labels = batch
    return F.cross_entropy(model(signals), labels)


def classification_scores(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, tuple]:
    """Sums and counts over the batch, from one forward pass: the kit adds them over the ranks and
    divides once, so eval_loss and eval_accuracy are exact at any world size."""
    signals, labels = batch
    logits = model(signals).float()
    return {
        "loss": (F.cross_entropy(logits, labels, reduction="sum"), len(labels)),
        "accuracy": ((logits.argmax(dim=1) == labels).sum(), len(labels)),
    }


class RandomShift:
    """Augmentation on the device: each training signal rotated in time by a random number of samples.

    The draws of a step are made for the whole global batch from (seed, epoch, step) and each rank
    takes its own slice, as it takes its slice of the samples: a sample's shift does not depend on
    the world size or the backend, and a resumed run draws the same shifts again."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor], context: BatchContext) -> tuple:
        signals, labels = batch
        if not context.training:
            return signals, labels
        draws = np.random.default_rng([context.seed, context.epoch, context.step]).integers(
            self.length, size=context.world_size * context.local_batch
        )
        mine = draws[context.rank * context.local_batch :][: len(signals)]
        shifts = torch.as_tensor(mine, device=signals.device)
        time = (torch.arange(self.length, device=signals.device) - shifts[:, None]) % self.length
        return signals.gather(2, time[:, None, :]), labels


def make_task(
    width: int = 32,
    length: int = 128,
    train_samples: int = 4096,
    test_samples: int = 1024,
    noise: float = 0.3,
    augment: bool = False,
) -> Task:
    """The signal classification task; each argument is a `--task-arg KEY=VALUE` (e.g. width=64)."""
    if width < 1 or length < 8:
        raise ValueError(f"width must be at least 1 and length at least 8, got width={width}, length={length}")
    return Task(
        build_model=lambda: SignalNet(width, len(WAVEFORMS)),  # called on every rank after seeding torch
        train_data=Signals(train_samples, length, noise, seed=DATA_SEED),
        test_data=Signals(test_samples, length, noise, seed=DATA_SEED + 1),
        loss=classification_loss,
        metrics=classification_scores,
        prepare_batch=RandomShift(length) if augment else None,
        name="signals",
        description={"model": f"conv1d-{width}", "data": f"signals-{length}", "classes": list(WAVEFORMS)},
    )
