"""The tutorial docs/tutorials/your-model.md, run as it is written, on examples/your_task.py.

Its step 4 (one process with batch 64 against 2 DDP ranks with 32 each, 10 steps, the weights
compared with harness.study.scaling.weights) and what the tutorial quotes of those two runs: the weights
within the kit's bound, the same evaluation, the record's `task`. Its step 5 as a tiny sweep with the
report, the figures and the prediction. Its step 2's one-line errors, and the example's
augmentation (docs/how-to/your-data.md): the same shifts at any world size. About a minute in all,
most of it the five launches' start-up.
"""

from __future__ import annotations

import os

import pytest
import torch

import harness
from harness.errors import UsageError
from harness.study.scaling.equivalence import UPDATE_BOUND
from harness.study.scaling.weights import (
    compare_with_reference,
    comparison_bound,
    comparison_table,
    initial_weights,
    load_weights,
)
from harness.tasks.loading import file_sha256, load_task
from harness.training.record import read_records
from tests.conftest import REPO, launch
from tests.conftest import harness as run_harness

TASK = "examples/your_task.py:make_task"
TASK_FLAGS = ["--task", TASK, "--task-arg", "width=64"]
CHECK = [*TASK_FLAGS, "--max-steps", "10", "--lr-scaling", "none"]  # the tutorial's step 4
TUTORIAL = os.path.join(REPO, "docs", "tutorials", "your-model.md")
TEST_SAMPLES = 1024  # make_task's default test_samples
# The tutorial says 2 ranks land "about 1e-5" from one process: well inside the bound, not at its edge.
TUTORIAL_DIFFERENCE = 1e-4


def _tutorial() -> str:
    """The tutorial's text, its line breaks and indentation as single spaces."""
    with open(TUTORIAL, encoding="utf-8") as handle:
        return " ".join(handle.read().split())


@pytest.fixture(autouse=True)
def _in_the_kit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the tutorial's commands run from the kit's directory, as its relative spec says


def _succeeded(result) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


@pytest.mark.slow
def test_two_ddp_ranks_train_what_one_process_trains(tmp_path):
    results = tmp_path / "check.jsonl"
    _succeeded(
        run_harness(
            "train",
            *CHECK,
            "--batch-size",
            "64",
            "--save-model",
            str(tmp_path / "one.pt"),
            "--results",
            str(results),
        )
    )
    launch(
        2, "ddp", [*CHECK, "--batch-size", "32", "--save-model", str(tmp_path / "ddp.pt"), "--results", str(results)]
    )

    config = harness.TrainConfig(task=TASK, task_args={"width": 64})
    rows = compare_with_reference(
        {"ddp, 2 ranks x 32": load_weights(str(tmp_path / "ddp.pt"))},
        reference=load_weights(str(tmp_path / "one.pt")),
        initial=initial_weights(config),
        bound=comparison_bound("cpu"),
    )
    print(comparison_table(rows))
    assert comparison_bound("cpu") == UPDATE_BOUND and rows[0]["within bound"], rows
    assert rows[0]["difference / update"] < TUTORIAL_DIFFERENCE, rows

    one, ddp = read_records([str(results)])
    assert (one["world_size"], ddp["world_size"]) == (1, 2)
    assert one["global_batch"] == ddp["global_batch"] == 64 and one["steps"] == ddp["steps"] == 10
    assert ddp["eval_samples"] == one["eval_samples"] == TEST_SAMPLES
    assert ddp["eval_loss"] == pytest.approx(one["eval_loss"], rel=1e-5)
    assert abs(ddp["eval_accuracy"] - one["eval_accuracy"]) <= 1 / TEST_SAMPLES  # one sample at most
    for record in (one, ddp):
        task = record["task"]
        assert (task["spec"], task["args"], task["name"], task["builtin"]) == (TASK, {"width": 64}, "signals", False)
        assert task["sha256"] == file_sha256(os.path.join(REPO, "examples", "your_task.py"))
        assert task["model_class"] == "SignalNet" and task["parameters"] > 0
        assert (record["model"], record["dataset"]) == ("conv1d-64", "signals-128")


@pytest.mark.slow
def test_a_sweep_of_the_task_reports_plots_and_predicts(tmp_path):
    results, figures = tmp_path / "mine.jsonl", tmp_path / "figures" / "mine"
    sweep = run_harness(
        "sweep",
        *TASK_FLAGS,
        "--backends",
        "fsdp",
        "--ranks",
        "1,2",
        "--scaling",
        "weak",
        "--repeats",
        "1",
        "--max-steps",
        "6",
        "--results",
        str(results),
    )
    _succeeded(sweep)
    records = read_records([str(results)])
    assert sorted(record["world_size"] for record in records) == [1, 2]
    assert {record["task"]["name"] for record in records} == {"signals"}

    report = run_harness("report", str(results))
    _succeeded(report)
    heading = "Weak scaling: conv1d-64 on signals-128"  # the record's model and dataset, as the tutorial quotes them
    assert heading in report.stdout and heading in _tutorial()

    _succeeded(run_harness("plot", str(results), "-o", str(figures)))
    assert (tmp_path / "figures" / "mine-throughput.png").stat().st_size > 0
    predict = run_harness(
        "predict", "--site", "polaris", "--record", str(results), "--backend", "fsdp", "-o", str(figures)
    )
    _succeeded(predict)
    assert "conv1d-64" in predict.stdout and (tmp_path / "figures" / "mine-prediction.png").stat().st_size > 0


def test_the_tutorials_errors_are_what_a_wrong_task_argument_gives():
    for arguments in ({"depth": 3}, {"width": 0}):
        with pytest.raises(UsageError) as raised:
            load_task(TASK, arguments)
        assert f"harness train: error: {raised.value}" in _tutorial()


def test_the_example_augmentation_does_not_depend_on_the_world_size():
    task = load_task(TASK, {"augment": True, "train_samples": 8, "test_samples": 8}).task
    signals, labels = task.train_data.signals, task.train_data.labels

    def shifted(rank: int, world_size: int, training: bool = True) -> torch.Tensor:
        share = len(signals) // world_size
        mine = slice(rank * share, (rank + 1) * share)
        context = harness.BatchContext(torch.device("cpu"), training, 2, 7, rank, world_size, share, 0)
        return task.prepare_batch((signals[mine], labels[mine]), context)[0]

    alone = shifted(0, 1)
    assert not torch.equal(alone, signals)  # it shifts
    assert torch.equal(torch.cat([shifted(0, 2), shifted(1, 2)]), alone)  # the same shifts at 2 ranks
    assert torch.equal(shifted(0, 1, training=False), signals)  # evaluation sees the signals as they are
