"""Evaluating in the middle of training changes nothing about training, under every backend, and
the evaluation of 2 ranks is that of one: on the test task `tokens` (tests/helpers/tasks.py), whose
model has dropout.

FSDP and DeepSpeed once evaluated on a plain copy of the model (now they evaluate on their shards);
building that copy drew its initialisation from the run's random generator, so every epoch after
an evaluation trained with other dropout masks (the demo's FSDP row: train loss
0.6682 after epoch 2 against 0.7250 for the others). Here each backend trains with dropout on and
an evaluation after every epoch, and its per-epoch train losses must equal those of the first
distributed backend trained without any evaluation before the last epoch's end, at the same ranks.

Each rank scores its own block of the test set and the task's sums are reduced once
(harness.training.evaluate): so the evaluation at the end of each run must equal `harness evaluate`
of its saved model on one rank (tests/integration/test_equivalence.py shows the same for a model
with batch norm, whose statistics are rank 0's).
"""

from __future__ import annotations

from typing import Any

import pytest

from harness.training.record import read_records
from tests.conftest import launch
from tests.helpers import tasks
from tests.helpers.backend_cases import ALL, DISTRIBUTED, ranks
from tests.helpers.weights import assert_evaluation_matches_one_rank

EPOCHS = 2
# A global batch so that a single-process backend runs the same steps as the 2-rank ones: 8 per
# epoch. Dropout 0.3 and an LR at which the model learns: one extra random draw before epoch 2
# (the defect's shift of every later mask, measured in one process) moves its loss by 1.8e-3.
TASK = tasks.flags("tokens", dropout=0.3)
FLAGS = [*TASK, "--global-batch", "64", "--lr", "0.5", "--seed", "0"]
FLAGS += ["--epochs", str(EPOCHS), "--threads", "1", "--calibration-steps", "0"]
# The losses are sums of float32 losses reduced in another order by each backend.
LOSS_TOLERANCE = 1e-4


def _train(tmp_path, backend: str, workers: int, eval_every: int) -> dict[str, Any]:
    """The record of a run; its model is saved as model.pt in `tmp_path`."""
    results = tmp_path / f"{backend}-{workers}-eval{eval_every}.jsonl"
    args = [*FLAGS, "--eval-every", str(eval_every), "--save-model", str(tmp_path / "model.pt")]
    launch(workers, backend, [*args, "--results", str(results)])
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
    expected = reference(workers)
    assert len(record["train_losses"]) == EPOCHS
    assert record["train_losses"] == pytest.approx(expected["train_losses"], rel=LOSS_TOLERANCE), (
        f"{backend} x{workers} with evaluation every epoch: train losses {record['train_losses']}, "
        f"without: {expected['train_losses']}"
    )
    # The same weights evaluated: the same loss.
    assert record["eval_loss"] == pytest.approx(expected["eval_loss"], rel=LOSS_TOLERANCE)
    assert_evaluation_matches_one_rank(record, tmp_path / "model.pt", TASK)


# ZeRO-3 gathers a module's weights inside its forward once it holds more than 1e5 elements: the GRU's
# at width 192 (3 x 192 x 192 per matrix); --zero-gathered-mb 0.25 has it free them after use, so that
# every evaluation forward gathers them again, as training's do.
ZERO3_GATHERING = ["--zero-stage", "3", "--zero-gathered-mb", "0.25", "--task-arg", "width=192"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zero3_evaluating_on_its_shards_mid_run_changes_nothing(tmp_path):
    """An evaluation after epoch 1, each rank's forwards gathering weights in step with the other's,
    leaves ZeRO-3's training as it was without it, and evaluates as one rank does."""
    runs = {}
    for eval_every in (0, 1):
        results = tmp_path / f"eval{eval_every}.jsonl"
        args = [*FLAGS, *ZERO3_GATHERING, "--eval-every", str(eval_every), "--save-model", str(tmp_path / "model.pt")]
        launch(2, "deepspeed", [*args, "--results", str(results)])
        runs[eval_every] = read_records([str(results)])[0]
    assert runs[1]["train_losses"] == pytest.approx(runs[0]["train_losses"], rel=LOSS_TOLERANCE)
    assert runs[1]["eval_loss"] == pytest.approx(runs[0]["eval_loss"], rel=LOSS_TOLERANCE)
    assert_evaluation_matches_one_rank(runs[1], tmp_path / "model.pt", [*TASK, "--task-arg", "width=192"])
