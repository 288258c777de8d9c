"""harness.workshop.pipeline (notebook 04): DistributedSampler padding counted as torch counts it, per-sample
correctness that reproduces the harness's exact evaluation, and the loading measurement."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from harness import TrainConfig
from harness.errors import UsageError
from harness.training.evaluate import Evaluation
from harness.training.plan import initial_model
from harness.training.score import evaluate_model_file
from harness.workshop.pipeline import (
    compare_loading,
    measure_loading,
    padded_evaluation,
    padded_indices,
    sample_correctness,
    write_image_tree,
)

DIGITS_TEST_SAMPLES = 297


def _torch_sampler_indices(num_samples: int, world_size: int, seed: int) -> list:
    """What every rank of torch's own DistributedSampler yields, rank after rank."""
    return [
        index
        for rank in range(world_size)
        for index in DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank, seed=seed)
    ]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "num_samples,world_size", [(297, 1), (297, 2), (297, 4), (297, 8), (297, 32), (10, 16), (12, 4)]
)
def test_padded_indices_are_torchs_and_count_its_duplicates(num_samples, world_size):
    indices = padded_indices(num_samples, world_size, seed=3)
    expected = _torch_sampler_indices(num_samples, world_size, seed=3)
    assert indices.tolist() == expected
    evaluation = padded_evaluation(np.ones(num_samples, dtype=bool), world_size, seed=3)
    assert evaluation.samples_scored == len(expected) == world_size * -(-num_samples // world_size)
    assert evaluation.duplicates == len(expected) - len(set(expected))
    assert set(expected) == set(range(num_samples))  # padding repeats samples; none is lost


def test_padded_accuracy_is_correct_among_the_scored_duplicates_included():
    correct = np.zeros(297, dtype=bool)
    correct[:150] = True
    indices = _torch_sampler_indices(297, 8, seed=0)
    evaluation = padded_evaluation(correct, 8, seed=0)
    assert evaluation.exact_accuracy == pytest.approx(150 / 297)
    assert evaluation.padded_accuracy == pytest.approx(correct[indices].sum() / len(indices))
    assert evaluation.accuracy_error == pytest.approx(evaluation.padded_accuracy - 150 / 297)


def test_padded_evaluation_refuses_a_world_size_below_one():
    with pytest.raises(UsageError, match="world_size"):
        padded_evaluation(np.ones(5, dtype=bool), 0)


def test_the_evaluation_batch_changes_how_many_forwards_not_the_result(tmp_path, monkeypatch):
    config = TrainConfig(backend="none", threads=1)
    model_file = str(tmp_path / "model.pt")
    torch.save(initial_model(config).state_dict(), model_file)
    forwards = []
    scores = Evaluation._scores
    monkeypatch.setattr(Evaluation, "_scores", lambda *args: forwards.append(1) or scores(*args))
    default = evaluate_model_file(config, model_file)
    assert len(forwards) == -(-DIGITS_TEST_SAMPLES // config.batch_size)
    forwards.clear()
    whole = evaluate_model_file(TrainConfig(backend="none", threads=1, eval_batch_size=1000), model_file)
    assert len(forwards) == 1
    assert whole["eval_samples"] == default["eval_samples"] == DIGITS_TEST_SAMPLES
    assert whole["eval_accuracy"] == default["eval_accuracy"]
    assert whole["eval_loss"] == pytest.approx(default["eval_loss"], rel=1e-6)  # summed in another order


def test_sample_correctness_reproduces_the_harness_exact_evaluation(tmp_path):
    config = TrainConfig(backend="none", threads=1)
    model_file = str(tmp_path / "model.pt")
    torch.save(initial_model(config).state_dict(), model_file)
    exact = evaluate_model_file(config, model_file)
    correct = sample_correctness(config, model_file)
    assert exact["eval_samples"] == len(correct) == DIGITS_TEST_SAMPLES  # every test sample once
    assert correct.mean() == pytest.approx(exact["eval_accuracy"], abs=1e-12)


@pytest.fixture(scope="module")
def image_tree(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("digits-png"))
    return directory, write_image_tree(directory)


def test_write_image_tree_writes_every_sample_in_the_imagefolder_layout(image_tree):
    directory, written = image_tree
    assert written == {"train": 1500, "test": DIGITS_TEST_SAMPLES}
    files = sum(len(names) for _, _, names in os.walk(os.path.join(directory, "val")))
    assert files == DIGITS_TEST_SAMPLES
    assert sorted(os.listdir(os.path.join(directory, "train"))) == [str(label) for label in range(10)]


def test_write_image_tree_refuses_a_directory_that_holds_one(image_tree):
    with pytest.raises(UsageError, match="empty directory"):
        write_image_tree(image_tree[0])


def test_measure_loading_names_the_sources_it_knows(image_tree):
    with pytest.raises(UsageError, match="per-sample"):
        measure_loading(image_tree[0], "jpeg-turbo")


def test_write_image_tree_writes_images_of_the_size_asked_for(tmp_path):
    from PIL import Image

    write_image_tree(str(tmp_path), size=40)
    first = next(os.path.join(root, names[0]) for root, _, names in os.walk(tmp_path / "train") if names)
    with Image.open(first) as image:
        assert image.size == (40, 40)


def _compute_over_total(measured) -> float:
    """AU as harness.training.metrics defines it: compute time / the timed steps' elapsed time."""
    return measured.compute_ms / 1000 / (measured.batch_size / measured.throughput)


def test_compare_loading_adds_up_each_configurations_interleaved_rounds(image_tree):
    configurations = [("per-sample", 0), ("prepared", 0)]
    measured = compare_loading(
        image_tree[0], configurations, rounds=2, steps=2, warmup_steps=1, batch_size=16, device="cpu"
    )
    assert [(m.source, m.num_workers, m.steps) for m in measured] == [("per-sample", 0, 4), ("prepared", 0, 4)]
    assert all(m.au == pytest.approx(_compute_over_total(m)) for m in measured)
    for m in measured:  # each round kept, in order, adding up to the whole
        assert len(m.round_throughputs) == len(m.round_data_wait_ms) == len(m.round_compute_ms) == 2
        assert sum(m.round_data_wait_ms) / 2 == pytest.approx(m.data_wait_ms)
        assert sum(m.round_compute_ms) / 2 == pytest.approx(m.compute_ms)
        assert min(m.round_throughputs) <= m.throughput <= max(m.round_throughputs)
        # the verdict every record carries, over this configuration's timed windows
        assert {"outside_cpu_share", "flagged", "reasons", "oversubscription"} <= set(m.contention)
    with pytest.raises(UsageError, match="once"):
        compare_loading(image_tree[0], configurations * 2)
