"""Mixed precision runs the same math under every backend: autocast with float32 weights, and for
fp16 the same dynamic loss scaling, with skipped steps counted. (bf16's equivalence with one
process is in tests/test_equivalence.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from harness import TrainConfig, train
from harness.backends import precision as precision_module
from harness.backends.precision import LOSS_SCALE, Precision

from .backend_cases import DISTRIBUTED
from .conftest import launch

FLAGS = [
    "--model",
    "cnn",
    "--dataset",
    "digits",
    "--batch-size",
    "16",
    "--max-steps",
    "4",
    "--threads",
    "1",
    "--dropout",
    "0",
    "--eval-every",
    "0",
    "--calibration-steps",
    "0",
    "--precision",
    "fp16",
]


@pytest.mark.slow
def test_fp16_scales_losses_alike_and_trains_alike_under_every_backend(tmp_path):
    """fp16 autocast on CPU is slow (no fp16 units), so a few steps each; every backend must state the
    same loss scaling and land on the same loss (the same math, float32 rounding apart)."""
    records = {}
    for backend in DISTRIBUTED:
        results = tmp_path / f"{backend}.jsonl"
        launch(2, backend, [*FLAGS, "--results", str(results)])
        records[backend] = json.loads(results.read_text())
    for backend, record in records.items():
        assert record["math"]["precision"] == "fp16" and record["math"]["autocast_dtype"] == "float16"
        assert record["math"]["loss_scaling"] == {"mode": "dynamic", **LOSS_SCALE}, backend
        assert record["skipped_steps"] == 0
    losses = [record["train_loss"] for record in records.values()]
    assert max(losses) - min(losses) <= 1e-4 * abs(losses[0]), losses


def test_an_overflowing_step_is_skipped_and_counted(monkeypatch):
    """A loss scale of 2^22 overflows float16 gradients: steps are skipped until the scale has backed off."""
    monkeypatch.setitem(precision_module.LOSS_SCALE, "init_scale", 2.0**22)
    record = train(
        TrainConfig(
            batch_size=32,
            max_steps=6,
            threads=1,
            precision="fp16",
            eval_every=0,
            calibration_steps=0,
            timing_warmup_steps=0,
        )
    )
    assert 1 <= record["skipped_steps"] < 6
    assert record["math"]["loss_scaling"]["init_scale"] == 2.0**22


def test_bf16_keeps_float32_weights_and_records_its_settings(tmp_path):
    model_file = tmp_path / "m.pt"
    record = train(
        TrainConfig(
            batch_size=32,
            max_steps=3,
            threads=1,
            precision="bf16",
            eval_every=0,
            calibration_steps=0,
            save_model=str(model_file),
        )
    )
    assert record["math"]["precision"] == "bf16" and record["math"]["loss_scaling"] is None
    assert record["math"]["weights_dtype"] == "float32" and record["skipped_steps"] == 0
    assert {value.dtype for value in torch.load(model_file, weights_only=True).values()} == {torch.float32}


def test_channels_last_trains_the_same_model():
    common = dict(batch_size=32, max_steps=3, threads=1, eval_every=0, calibration_steps=0, dropout=0.0)
    plain, channels_last = train(TrainConfig(**common)), train(TrainConfig(channels_last=True, **common))
    assert channels_last["train_losses"] == pytest.approx(plain["train_losses"], rel=1e-5)
    assert channels_last["eval_accuracy"] == pytest.approx(plain["eval_accuracy"], abs=1 / 297)


def test_precisions_are_the_documented_ones():
    assert Precision.of("fp32").autocast_dtype is None and not Precision.of("bf16").loss_scaling
    assert Precision.of("fp16").grad_scaler(torch.device("cpu")).get_growth_interval() == LOSS_SCALE["growth_interval"]
