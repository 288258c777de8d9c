"""The Python API and the results record, in-process on the single-process backend."""

from __future__ import annotations

import json

import pytest
import torch

from harness import TrainConfig, UsageError, train
from harness.models import build_model

RECORD_FIELDS = {"backend", "world_size", "local_batch", "global_batch", "model", "dataset", "steps", "epochs",
                 "lr_effective", "throughput", "throughput_per_worker", "epoch_times", "train_loss", "eval_loss",
                 "eval_accuracy", "eval_samples", "versions", "config", "math", "au"}


def test_train_returns_and_appends_a_complete_record(tmp_path):
    results, model_file = tmp_path / "r.jsonl", tmp_path / "m.pt"
    config = TrainConfig(max_steps=12, batch_size=32, results=str(results), save_model=str(model_file), threads=1)
    record = train(config)
    assert RECORD_FIELDS <= record.keys()
    assert (record["world_size"], record["global_batch"], record["steps"]) == (1, 32, 12)
    assert record["eval_samples"] == 297  # the whole digits test split, once
    assert record["timed_steps"] == 12 - record["timing_warmup_steps"] and record["throughput"] > 0
    assert record["math"]["gradient_clipping"] is None and record["math"]["gradient_averaging"] == "mean over ranks"
    assert record["versions"]["torch"] == torch.__version__
    lines = results.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["run_id"] == record["run_id"]
    assert TrainConfig.from_dict(record["config"]) == config
    state = torch.load(model_file, weights_only=True)  # plain tensors only
    assert state.keys() == build_model("cnn", 1, 28, 10).state_dict().keys()


def test_training_on_digits_learns(tmp_path):
    record = train(TrainConfig(epochs=2, batch_size=32, lr=0.05, threads=1))
    assert record["eval_accuracy"] > 0.85, record["eval_accuracy"]
    assert record["train_losses"][1] < record["train_losses"][0]


def test_effective_lr_follows_the_scaling_rule():
    record = train(TrainConfig(max_steps=2, batch_size=32, base_batch=16, lr=0.1, lr_scaling="sqrt", threads=1,
                               timing_warmup_steps=0))
    assert record["lr_effective"] == pytest.approx(0.1 * 2 ** 0.5)


def test_api_raises_usage_error_for_bad_config():
    with pytest.raises(UsageError, match="unknown backend 'nccl'"):
        train(TrainConfig(backend="nccl"))


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnets_take_digits_and_synthetic_shapes(name):
    model = build_model(name, 1, 28, 10)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert sum(p.numel() for p in build_model("cnn", 1, 28, 10).parameters()) == 1_199_882
