"""Backends at 2 ranks x batch b train the same weights as one process with batch 2b.

This catches real mismatches: DeepSpeed clips gradients at norm 1.0 unless told otherwise, and
an untouched config trains a different model from DDP and Horovod (0.11 max weight difference
after 20 SGD steps). The harness sets such defaults explicitly and identically.
"""

from __future__ import annotations

import pytest
import torch

from harness.models import build_model

from .conftest import launch

STEPS = 20
LOCAL_BATCH = 16
COMMON = ["--model", "cnn", "--dataset", "digits", "--dropout", "0", "--seed", "0", "--lr-scaling", "none",
          "--max-steps", str(STEPS), "--threads", "1", "--eval-every", "0"]
OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
              "adam": ["--optimizer", "adam", "--lr", "0.001"]}
DISTRIBUTED = [("ddp", []), ("horovod", []), ("deepspeed", []), ("deepspeed", ["--zero-stage", "2"]),
               ("deepspeed", ["--zero-stage", "3"])]


def _weights(path) -> dict:
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """Weights of the `none` baseline with the 2-rank global batch, per optimizer (and clipping)."""
    out = tmp_path_factory.mktemp("baseline")
    weights = {}
    for name, flags in [*OPTIMIZERS.items(), ("sgd-clip", OPTIMIZERS["sgd"] + ["--grad-clip", "0.5"])]:
        path = out / f"{name}.pt"
        launch(1, "none", [*COMMON, *flags, "--batch-size", str(2 * LOCAL_BATCH), "--save-model", str(path)])
        weights[name] = _weights(path)
    return weights


def _train_two_ranks(tmp_path, backend, extra):
    path = tmp_path / "model.pt"
    launch(2, backend, [*COMMON, *extra, "--batch-size", str(LOCAL_BATCH), "--save-model", str(path)])
    return _weights(path)


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags", DISTRIBUTED, ids=["ddp", "horovod", "deepspeed", "deepspeed-zero2", "deepspeed-zero3"])
def test_sgd_momentum_weights_match_single_process(tmp_path, single_process, backend, backend_flags):
    weights = _train_two_ranks(tmp_path, backend, OPTIMIZERS["sgd"] + backend_flags)
    reference = single_process["sgd"]
    assert weights.keys() == reference.keys()
    worst = max((weights[k] - reference[k]).abs().max().item() for k in reference)
    assert worst <= 1e-5, f"{backend}: max abs weight difference {worst:.3g} after {STEPS} SGD steps"
    torch.manual_seed(0)  # the seed of COMMON: the weights training started from
    initial = build_model("cnn", 1, 28, 10, 0.0).state_dict()["classifier.3.weight"]
    moved = (reference["classifier.3.weight"] - initial).abs().max().item()
    assert moved > 1e-3  # training really changed the weights, so the comparison means something


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "horovod", "deepspeed"])
def test_adam_weights_match_single_process(tmp_path, single_process, backend):
    weights = _train_two_ranks(tmp_path, backend, OPTIMIZERS["adam"])
    reference = single_process["adam"]
    relative = {k: ((weights[k] - reference[k]).norm() / reference[k].norm()).item() for k in reference}
    worst = max(relative, key=relative.get)
    assert relative[worst] <= 5e-5, f"{backend}: {worst} differs by {relative[worst]:.3g} (relative) after Adam"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ddp", "horovod", "deepspeed"])
def test_gradient_clipping_is_applied_identically(tmp_path, single_process, backend):
    weights = _train_two_ranks(tmp_path, backend, OPTIMIZERS["sgd"] + ["--grad-clip", "0.5"])
    reference = single_process["sgd-clip"]
    worst = max((weights[k] - reference[k]).abs().max().item() for k in reference)
    assert worst <= 1e-5, f"{backend}: clipped run differs by {worst:.3g}"
    unclipped = max((single_process["sgd"][k] - reference[k]).abs().max().item() for k in reference)
    assert unclipped > 1e-3  # clipping at 0.5 really changes this run
