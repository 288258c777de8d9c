"""Model weights as the tests compare them: loaded as the harness loads them, their differences,
and a saved model scored again by `harness evaluate`'s function."""

from __future__ import annotations

import argparse
from typing import Any, Optional

import pytest
import torch

from harness.config import TrainConfig
from harness.fileio import load_tensors
from harness.study.scaling import weights as study_weights
from harness.study.scaling.equivalence import update_differences, worst
from harness.training.flags import add_train_flags, config_from_args
from harness.training.plan import initial_model
from harness.training.score import evaluate_model_file

Weights = dict[str, torch.Tensor]
CNN = ["--model", "cnn", "--dataset", "digits", "--dropout", "0", "--seed", "0"]
# Float32 scores of the same samples summed in other groups: 3e-8 apart, measured (2 ranks of ddp on the
# batch-norm task `regression`); its weights with another process's running statistics scored twice the loss.
EVALUATION_TOLERANCE = 1e-5


def load_weights(path) -> Weights:
    """A model file's tensors, loaded as the harness loads them (plain tensors only, else a UsageError)."""
    return load_tensors(str(path))


def max_abs_difference(first: Weights, second: Weights) -> float:
    """The largest absolute difference between two state dicts with the same keys."""
    assert first.keys() == second.keys()
    return max((first[key] - second[key]).abs().max().item() for key in first)


def train_config(train_args: list[str]) -> TrainConfig:
    """The TrainConfig that `harness train TRAIN_ARGS` runs, read by the command's own parser."""
    parser = argparse.ArgumentParser()
    add_train_flags(parser)
    return config_from_args(parser.parse_args(train_args))


def farthest_parameter(trained: Weights, reference: Weights, train_args: list[str]) -> tuple[str, float]:
    """(name, value) of the parameter farthest from `reference`, relative to the reference's update
    from the weights that `harness train TRAIN_ARGS` starts from (harness.study.scaling.equivalence).

    Parameters only: buffers such as batch-norm statistics are each rank's own (the saved model's are
    rank 0's), so a 2-rank run's legitimately differ from one process's."""
    config = train_config(train_args)
    names = [name for name, _ in initial_model(config).named_parameters()]
    return worst(
        update_differences(trained, {name: reference[name] for name in names}, study_weights.initial_weights(config))
    )


def update_difference(trained: Weights, reference: Weights, train_args: Optional[list[str]] = None) -> float:
    """farthest_parameter's value; by default for the digits CNN without dropout from seed 0."""
    return farthest_parameter(trained, reference, CNN if train_args is None else train_args)[1]


def initial_weights() -> Weights:
    """The digits CNN (no dropout) as seed 0 makes it: the weights the CNN trainings start from."""
    return study_weights.initial_weights(train_config(CNN))


def assert_evaluation_matches_one_rank(record: dict[str, Any], model_file, train_args: list[str]) -> None:
    """The evaluation at the end of a run (each rank scoring its block of the test set with rank 0's
    buffers) equals `harness evaluate` of its saved model (rank 0's) on one rank, in this process:
    the same sums, added in another order."""
    config = train_config([*train_args, "--backend", "none", "--threads", "1"])
    again = evaluate_model_file(config, str(model_file))
    scores = sorted(key for key in again if key.startswith("eval_"))
    assert scores == sorted(key for key in record if key.startswith("eval_")), (scores, record.keys())
    for key in scores:
        assert record[key] == pytest.approx(again[key], rel=EVALUATION_TOLERANCE), (
            f"{key}: {record[key]} at {record['world_size']} ranks, {again[key]} of the saved model at one"
        )
