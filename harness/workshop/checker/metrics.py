"""What rank 0 tells of each epoch: the metrics of all ranks, added up, once.

In each rank (observe): the training loss the rank computed, as its model's output on each
training batch against the batch's labels (`TrainLosses`, a forward hook: exactly the script's own
loss, without asking the script for it), the sums workshop.evaluate returned, and what the rank
wrote to stdout (`StdoutTee`).

Judged (property 6, `check_metrics`): only rank 0 reports. If it reports through workshop.report,
the sums it reports must count every sample trained that epoch and every test image. If it prints
its own line instead, its numbers are compared with the values it would print from its own sums
and from the sums of all ranks (the loss and accuracy, the sums and counts, per epoch): a number
that is rank 0's own value but not the global one, with no global value printed anywhere, is an
unreduced metric; no value at all is a missing epoch line. A number matches a value within half
a unit of its last printed digit (a percentage: of 100 x the value); a plain integer must be exact.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, TextIO

import torch
import torch.nn.functional as F

from .. import exercise
from .todos import Failure

if TYPE_CHECKING:
    from .observe import Observation

KEYS = ("metrics",)
STDOUT_LIMIT = 1 << 20  # characters of a rank's stdout kept (a script printing every step stays bounded)
# A printed number: its digits, an exponent, and whether a percent sign follows.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?P<digits>\d+(?:\.\d*)?|\.\d+)(?:[eE](?P<exp>[-+]?\d+))?(?P<pct>\s?%)?")
Value = tuple[str, float, float]  # what, rank 0's own value, the value over all ranks


class StdoutTee:
    """sys.stdout that also hands what is written to `record` (up to STDOUT_LIMIT characters)."""

    def __init__(self, stream: TextIO, record: Callable[[str], None]) -> None:
        self._stream, self._record, self._kept = stream, record, 0

    def write(self, text: str) -> int:
        if self._kept < STDOUT_LIMIT:
            self._record(text[: STDOUT_LIMIT - self._kept])
            self._kept += len(text)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class TrainLosses:
    """Each training pass's summed loss and sample count, from the model's output on each training
    batch (a forward hook in training mode) and the labels of the samples fetched for it; a batch
    split into micro-batches (consecutive parts, in order) gives one output per part."""

    def __init__(self) -> None:
        self.pending: list[int] = []  # training samples fetched since the last training forward
        self.sums: dict[int, list[float]] = {}  # pass over the training data -> [summed loss, samples]
        self._labels: Optional[torch.Tensor] = None

    def fetched(self, indices: Sequence[int]) -> None:
        self.pending.extend(indices)

    def forward(self, training_pass: int, module: torch.nn.Module, output: Any) -> None:
        if not module.training or not self.pending or not torch.is_tensor(output):
            return
        if output.dim() != 2 or output.shape[0] > len(self.pending):
            self.pending = []
            return  # not the workshop CNN's logits for this batch
        # The first rows of what was fetched: the whole batch, or its next micro-batch (step 7).
        indices, self.pending = self.pending[: output.shape[0]], self.pending[output.shape[0] :]
        if self._labels is None:
            self._labels = exercise.digits("train").labels
        with torch.no_grad():
            loss = F.cross_entropy(output.detach().float().cpu(), self._labels[indices], reduction="sum").item()
        sums = self.sums.setdefault(training_pass, [0.0, 0])
        sums[0] += loss
        sums[1] += len(indices)


def _check_reports(observations: list[Observation]) -> list[Failure]:
    """The sums rank 0 reported through workshop.report count every rank's samples."""
    test_size = len(exercise.digits("test"))
    epochs = [observation.passes("train") for observation in observations]
    trained = [sum(len(passes[epoch]) for passes in epochs if epoch < len(passes)) for epoch in range(len(epochs[0]))]
    for epoch, (_, train_samples), (_, _, test_samples) in observations[0].reports:
        if abs(test_samples - test_size) > 1e-6:
            return [
                Failure(
                    "metrics",
                    f"rank 0 reported the test loss and accuracy of epoch {epoch + 1} over "
                    f"{test_samples:g} images, not all {test_size}: add up the sums and counts of "
                    "all ranks (not their averages)",
                    KEYS,
                )
            ]
        if epoch < len(trained) and abs(train_samples - trained[epoch]) > 1e-6:
            return [
                Failure(
                    "metrics",
                    f"rank 0 reported the training loss of epoch {epoch + 1} over "
                    f"{train_samples:g} samples, but the ranks trained on {trained[epoch]}: add "
                    "up the sums and counts of all ranks (not their averages)",
                    KEYS,
                )
            ]
    return []


def epoch_values(observations: list[Observation]) -> Iterator[Value]:
    """Each value an epoch's line may show, as rank 0's own sums give it and as all ranks' do."""
    losses = [observation.train_losses for observation in observations]
    for index, number in enumerate(sorted(set.intersection(*(set(sums) for sums in losses))), 1):
        (loss, samples), (total_loss, total_samples) = (
            losses[0][number],
            [sum(column) for column in zip(*(sums[number] for sums in losses))],
        )
        epoch = f"epoch {index}"
        yield f"training loss of {epoch}", loss / samples, total_loss / total_samples
        yield f"training samples of {epoch}", samples, total_samples
        yield f"summed training loss of {epoch}", loss, total_loss
    evaluations = [observation.evaluations for observation in observations]
    for number in range(min(len(sums) for sums in evaluations)):
        (loss, correct, images), totals = (
            evaluations[0][number],
            [sum(column) for column in zip(*(sums[number] for sums in evaluations))],
        )
        yield f"test loss of evaluation {number + 1}", loss / images, totals[0] / totals[2]
        yield f"test accuracy of evaluation {number + 1}", correct / images, totals[1] / totals[2]
        yield f"test images of evaluation {number + 1}", images, totals[2]
        yield f"correct test images of evaluation {number + 1}", correct, totals[1]
        yield f"summed test loss of evaluation {number + 1}", loss, totals[0]


@dataclass(frozen=True)
class Printed:
    """A number as printed, and how far from it a value it shows may be."""

    text: str
    value: float
    tolerance: float
    percent: bool
    decimals: int

    def shows(self, value: float) -> bool:
        target = 100 * value if self.percent else value
        return abs(self.value - target) <= self.tolerance + 1e-9 * abs(target)

    def like(self, value: float) -> str:
        """`value` printed as this number is."""
        return f"{100 * value:.{self.decimals}f}%" if self.percent else f"{value:.{self.decimals}f}"


def printed_numbers(text: str) -> list[Printed]:
    """Every number in `text`, with half a unit of its last digit as its tolerance (exact for a
    plain integer, which is a count or an epoch's number rather than a rounded value)."""
    numbers = []
    for match in NUMBER.finditer(text):
        digits, percent = match["digits"], match["pct"] is not None
        rounded = "." in digits or match["exp"] is not None or percent
        decimals = len(digits.partition(".")[2])
        tolerance = 0.5 * 10.0 ** (int(match["exp"] or 0) - decimals) if rounded else 0.0
        numbers.append(
            Printed(
                match[0].strip(),
                float(match[0].replace("%", "")),
                tolerance,
                percent,
                max(0, decimals - int(match["exp"] or 0)),
            )
        )
    return numbers


def _check_printed(observations: list[Observation]) -> list[Failure]:
    """Rank 0 printed its epoch lines itself: from the sums of all ranks, and at all."""
    values = list(epoch_values(observations))
    if not values:
        return []  # no training loss or evaluation seen to compare with
    numbers = printed_numbers("".join(observations[0].printed))
    own = [
        (what, number, mine, everyone)
        for what, mine, everyone in values
        for number in numbers
        if number.shows(mine) and not number.shows(everyone)
    ]
    shown_global = any(
        number.shows(everyone) and not number.shows(mine) for _, mine, everyone in values for number in numbers
    )
    if own and not shown_global:
        what, number, mine, everyone = own[0]
        return [
            Failure(
                "metrics",
                f"rank 0 printed its own {what} ({number.text}), not that of all ranks "
                f"({number.like(everyone)}): add up the sums and counts of all ranks before rank 0 "
                "prints them",
                KEYS,
            )
        ]
    if not any(number.shows(mine) or number.shows(everyone) for _, mine, everyone in values for number in numbers):
        return [
            Failure(
                "metrics",
                "rank 0 printed no epoch line with the ranks' loss and accuracy: add up the sums "
                "and counts of all ranks, then print them from rank 0 (workshop.report)",
                KEYS,
            )
        ]
    return []


def check_metrics(observations: list[Observation]) -> list[Failure]:
    """Property 6: only rank 0 reports, with the sums and counts of all ranks."""
    others = [observation.rank for observation in observations[1:] if observation.reports]
    if others:
        return [
            Failure(
                "metrics", f"rank {others[0]} printed an epoch's line too (workshop.report): only rank 0 prints", KEYS
            )
        ]
    return _check_reports(observations) if observations[0].reports else _check_printed(observations)
