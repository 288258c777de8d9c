"""Model weights as the tests compare them: loaded as the harness loads them, and their differences."""

from __future__ import annotations

import torch

from harness.fileio import load_tensors
from harness.study.equivalence import update_differences, worst
from harness.tasks.models import build_model


def load_weights(path) -> dict[str, torch.Tensor]:
    """A model file's tensors, loaded as the harness loads them (plain tensors only, else a UsageError)."""
    return load_tensors(str(path))


def max_abs_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    assert first.keys() == second.keys()
    return max((first[key] - second[key]).abs().max().item() for key in first)


def initial_weights() -> dict[str, torch.Tensor]:
    """The digits CNN (no dropout) as seed 0 makes it: the weights the tests' trainings start from."""
    torch.manual_seed(0)
    return build_model("cnn", 1, 28, 10, 0.0).state_dict()


def update_difference(trained: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """The worst tensor's difference from the reference, relative to the reference's update from
    initial_weights() (harness.study.equivalence)."""
    return worst(update_differences(trained, reference, initial_weights()))[1]
