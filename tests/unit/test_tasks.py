"""A researcher's task that is wrong ends in one line naming the task and the fix, exit status 2,
nothing appended to --results and no model written, before any rank waits for another.

The tasks are tests/helpers/bad_tasks.py's (and a file that does not import, written here); each
runs `harness.cli.main` in this process at one rank, the function the `harness` command runs, so
the table stays fast. The mistakes only ranks can see (a part that differs between ranks) run under
a real launcher in tests/integration/test_bad_input_cli.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, NamedTuple

import pytest

from harness import TrainConfig, train
from harness.cli import main
from harness.errors import UsageError
from tests.helpers import bad_tasks, tasks

BAD_TASKS = os.path.abspath(bad_tasks.__file__)
TRAIN = ["train", "--batch-size", "16", "--max-steps", "2", "--threads", "1", "--calibration-steps", "0"]


def _bad(function: str) -> Callable[[Path], str]:
    return lambda tmp: f"{BAD_TASKS}:{function}"


def _not_importing(tmp: Path) -> str:
    (tmp / "broken.py").write_text("import numpy_with_a_typo\n")
    return f"{tmp / 'broken.py'}:make"


class Case(NamedTuple):
    name: str
    spec: Callable[[Path], str]  # the --task spec, given a private directory
    message: str  # a part of the one line the user sees, after "task 'SPEC'"
    extra: tuple[str, ...] = ()  # further `harness train` flags


CASES = [
    Case(
        "file that does not import",
        _not_importing,
        "raised ModuleNotFoundError: No module named 'numpy_with_a_typo' (broken.py line 1); fix the file",
    ),
    Case(
        "file that does not exist",
        lambda tmp: f"{tmp / 'missing.py'}:make",
        "does not exist; fix --task (a path, then :FUNCTION)",
    ),
    Case(
        "module that does not exist",
        lambda tmp: "tests.helpers.no_such_module:make",
        "needs tests.helpers.no_such_module, which is not installed; fix --task",
    ),
    Case("missing function", _bad("no_such_function"), "has no function 'no_such_function' (it defines: "),
    Case(
        "factory that raises",
        _bad("raises"),
        f"raises() raised FileNotFoundError: {bad_tasks.FACTORY_ERROR} (bad_tasks.py line ",
    ),
    Case(
        "argument the factory does not take",
        lambda tmp: f"{tasks.TASK_FILE}:regression",
        "takes arguments width, train_samples, test_samples, given depth; fix --task-arg",
        ("--task-arg", "depth=3"),
    ),
    Case(
        "factory that returns the parts",
        _bad("not_a_task"),
        "returned a dict, not a harness.Task; return Task(build_model=..., train_data=..., loss=...)",
    ),
    Case("training data of length 0", _bad("empty_data"), "(train_data is empty: give it samples)"),
    Case(
        "data smaller than one global batch",
        _bad("tiny_data"),
        "the training set has 10 samples, fewer than one global batch of 32; lower --batch-size or use fewer workers",
        ("--batch-size", "32"),
    ),
    Case(
        "loss that is not a scalar",
        _bad("per_sample_loss"),
        "loss returned a tensor of shape [16, 1], not a scalar tensor; return the batch's mean loss",
    ),
    Case(
        "loss NaN at the first step",
        _bad("nan_loss"),
        "the loss is nan on the first training batch; fix the model's initialisation, the loss, or the data "
        "(the batch holds [16, 8] float32, [16, 1] float32)",
    ),
    Case(
        "model without parameters",
        _bad("no_parameters"),
        "build_model returned a Sequential without parameters; a backend has nothing to train",
    ),
    Case(
        "loss that does not depend on the model",
        _bad("detached_loss"),
        "the loss does not depend on the model's parameters; compute it from model(batch)",
    ),
    Case(
        "loss that reaches no parameter of the model",
        _bad("parameter_outside_the_model"),
        "the loss reaches none of the model's parameters; compute it from model(batch)",
    ),
    Case(
        "metric that cannot be reduced",
        _bad("mean_metric"),
        "not a (sum, count) pair of numbers; return sums, which the kit adds over ranks and divides once",
    ),
    Case(
        "batch that does not fit the model",
        _bad("wrong_width"),
        "the model or loss failed on the first batch (RuntimeError: addmm: mat1 and mat2 shapes cannot be "
        "multiplied (16x8 and 10x16)); the batch holds [16, 8] float32, [16, 1] float32",
    ),
    Case(
        "ddp on a model with parameters unused in some steps",
        lambda tmp: f"{tasks.TASK_FILE}:auxiliary",
        "parameters auxiliary.weight, auxiliary.bias got no gradient from a step's loss; DDP needs "
        "--ddp-find-unused-parameters for such a model",
        ("--backend", "ddp"),
    ),
    Case(
        "batch whose tensors have other numbers of rows",
        _bad("ragged_batch"),
        "holds tensors of shapes (16, 8), (512, 1); every tensor must have one row per sample",
    ),
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.name) for case in CASES])
def test_a_bad_task_is_one_line_naming_the_task_and_the_fix(case, tmp_path, capsys):
    spec = case.spec(tmp_path)
    results, model = tmp_path / "results.jsonl", tmp_path / "model.pt"
    capsys.readouterr()
    status = main([*TRAIN, "--task", spec, *case.extra, "--results", str(results), "--save-model", str(model)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"harness train: error: task {spec!r}"), lines[0]
    assert case.message in lines[0], lines[0]
    assert not results.exists() and not model.exists()


def test_the_python_api_raises_the_same_line_for_a_task_function_given_directly(tmp_path):
    """harness.train(config, task=FUNCTION), as a notebook calls it: the task named by its module and function."""
    config = TrainConfig(batch_size=16, max_steps=2, threads=1, calibration_steps=0, results=str(tmp_path / "r.jsonl"))
    with pytest.raises(UsageError) as raised:
        train(config, task=bad_tasks.per_sample_loss)
    assert str(raised.value).startswith("task 'tests.helpers.bad_tasks:per_sample_loss': loss returned a tensor")
    assert not (tmp_path / "r.jsonl").exists()
