"""Evaluating in the middle of training changes nothing about training, under every backend.

FSDP and DeepSpeed evaluate on a plain copy of the model (their forward gathers sharded weights, a
collective); building that copy once drew its initialisation from the run's random generator, so
every epoch after an evaluation trained with other dropout masks (the demo's FSDP row: train loss
0.6682 after epoch 2 against 0.7250 for the others). Here each backend trains with dropout on and
an evaluation after every epoch, and its per-epoch train losses must equal those of the first
distributed backend trained without any evaluation before the last epoch's end, at the same ranks.
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.training.record import read_records
from tests.conftest import launch
from tests.helpers.backend_cases import ALL, DISTRIBUTED, ranks

EPOCHS = 2
# The CNN's own dropout (no --dropout flag: its defaults, 0.25 and 0.5); a global batch so that a
# single-process backend runs the same steps as the 2-rank ones.
FLAGS = ["--model", "cnn", "--dataset", "digits", "--global-batch", "64", "--lr", "0.02", "--seed", "0"]
FLAGS += ["--epochs", str(EPOCHS), "--threads", "1", "--calibration-steps", "0"]
# The losses are sums of float32 losses reduced in another order by each backend; the defect moved
# epoch 2's loss by 3%.
LOSS_TOLERANCE = 1e-4


def _train(tmp_path, backend: str, workers: int, eval_every: int) -> dict[str, Any]:
    results = tmp_path / f"{backend}-{workers}-eval{eval_every}.jsonl"
    launch(workers, backend, [*FLAGS, "--eval-every", str(eval_every), "--results", str(results)])
    return read_records([str(results)])[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The first distributed backend's record without evaluation before the end, per rank count."""
    cache: dict[int, dict[str, Any]] = {}

    def get(workers: int) -> dict[str, Any]:
        if workers not in cache:
            cache[workers] = _train(tmp_path_factory.mktemp(f"reference-{workers}"), DISTRIBUTED[0], workers, 0)
        return cache[workers]

    return get


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", ALL)
def test_evaluating_every_epoch_leaves_the_dropout_masks_alone(tmp_path, reference, backend):
    workers = ranks(backend)
    record = _train(tmp_path, backend, workers, eval_every=1)
    expected = reference(workers)["train_losses"]
    assert len(record["train_losses"]) == EPOCHS
    assert record["train_losses"] == pytest.approx(expected, rel=LOSS_TOLERANCE), (
        f"{backend} x{workers} with evaluation every epoch: train losses {record['train_losses']}, without: {expected}"
    )
    # The same weights evaluated: the same accuracy, give or take one test sample whose two top
    # classes the reduction order can swap.
    samples = record["eval_samples"]
    assert record["eval_accuracy"] == pytest.approx(reference(workers)["eval_accuracy"], abs=1.01 / samples)
