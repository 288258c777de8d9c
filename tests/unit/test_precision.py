"""Mixed precision runs the same math under every backend: autocast with float32 weights, and for
fp16 the same dynamic loss scaling, with skipped steps counted. (bf16's equivalence with one
process is in tests/integration/test_equivalence.py.)"""

from __future__ import annotations

import pytest
import torch

from harness import TrainConfig, train
from harness.backends import precision as precision_module
from harness.backends.precision import LOSS_SCALE, Precision
from tests.helpers.weights import load_weights


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
    assert {value.dtype for value in load_weights(model_file).values()} == {torch.float32}


def test_channels_last_trains_the_same_model():
    common = dict(batch_size=32, max_steps=3, threads=1, eval_every=0, calibration_steps=0, task_args={"dropout": 0.0})
    plain, channels_last = train(TrainConfig(**common)), train(TrainConfig(channels_last=True, **common))
    assert channels_last["train_losses"] == pytest.approx(plain["train_losses"], rel=1e-5)
    assert channels_last["eval_accuracy"] == pytest.approx(plain["eval_accuracy"], abs=1 / 297)


def test_precisions_are_the_documented_ones():
    assert Precision.of("fp32").autocast_dtype is None and not Precision.of("bf16").loss_scaling
    assert Precision.of("fp16").grad_scaler(torch.device("cpu")).get_growth_interval() == LOSS_SCALE["growth_interval"]
