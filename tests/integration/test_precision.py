"""fp16 under every backend on real launchers."""

from __future__ import annotations

import json

import pytest

from harness.backends.precision import LOSS_SCALE
from tests.conftest import launch
from tests.helpers.backend_cases import DISTRIBUTED

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
