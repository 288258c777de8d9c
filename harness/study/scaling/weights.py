"""Weights of runs, compared: where a run starts, what it saved, and how far apart two runs ended.

`harness.train` builds its task's model after seeding torch with `config.seed`, identically on
every rank and backend; `initial_weights(config)` rebuilds those weights, so a notebook can measure every run
relative to how far training moved it (harness.study.scaling.equivalence.update_differences).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ...config import TrainConfig
from ...training.plan import initial_model
from .equivalence import BF16_UPDATE_BOUND, UPDATE_BOUND, update_differences, worst

Weights = dict[str, torch.Tensor]


def initial_weights(config: TrainConfig, task: Any = None) -> Weights:
    """The weights `harness.train(config, task=task)` starts from, on the CPU (the seed, the task and
    its arguments decide them). Leaves torch's random state as it was."""
    model = initial_model(config, task)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def load_weights(path: str) -> Weights:
    """A model file written by `harness.train(..., save_model=path)`, as CPU tensors."""
    return torch.load(path, map_location="cpu", weights_only=True)


def compare_with_reference(
    runs: Mapping[str, Weights], reference: Weights, initial: Weights, bound: float = UPDATE_BOUND
) -> list[dict[str, Any]]:
    """For each run: the tensor farthest from `reference` relative to the update (see
    harness.study.scaling.equivalence), its value, and whether it is within `bound`. One dict per run, in order."""
    rows = []
    for label, weights in runs.items():
        name, value = worst(update_differences(weights, reference, initial))
        max_abs = max((weights[key].double() - reference[key].double()).abs().max().item() for key in reference)
        rows.append(
            {
                "run": label,
                "worst tensor": name,
                "difference / update": value,
                "max abs difference": max_abs,
                "within bound": value <= bound,
            }
        )
    return rows


def comparison_bound(device: str) -> float:
    """How far (relative to the update) two equivalent trainings may end apart on `device`.

    On the CPU, float32 rounding: UPDATE_BOUND. On a GPU cuDNN runs convolutions in TF32 by default
    (10 mantissa bits instead of 23), so the rounding that the batch split reorders is that of a
    reduced precision: BF16_UPDATE_BOUND, which the mistakes (clipping 0.68, LR x2 4.9) still exceed.
    """
    return UPDATE_BOUND if device == "cpu" else BF16_UPDATE_BOUND


def comparison_table(rows: list[dict[str, Any]]) -> str:
    """Markdown of compare_with_reference's rows."""
    from .report import markdown_table

    return markdown_table(rows, [(key, lambda row, key=key: row[key]) for key in rows[0]] if rows else [])
