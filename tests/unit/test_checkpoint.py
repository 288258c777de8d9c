"""Checkpoints on the single-process backend, in-process: exact resume, fallback, atomic layout.

The multi-process backends are covered by tests/integration/test_preemption.py (same code path, behind the
Backend interface); these run in the test process to stay fast.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random

import numpy as np
import pytest
import torch

from harness import TrainConfig, train
from harness.backends import BACKENDS
from harness.errors import Preempted, UsageError
from harness.tasks.images import ImageOptions
from harness.training.checkpoint import Checkpoint, RunLayout, capture_rng_state, restore_rng_state
from harness.training.resume import check_compatible
from tests.helpers.checkpoint_helpers import checkpoint_steps, records
from tests.helpers.weights import load_weights, max_abs_difference

CONFIG = TrainConfig(
    task_args={"model": "cnn", "dataset": "digits", "dropout": 0.25},
    batch_size=128,
    epochs=3,
    lr=0.02,
    seed=7,
    threads=1,
    eval_every=0,
    calibration_steps=0,
    timing_warmup_steps=2,
)
TOTAL_STEPS = 33  # 11 per epoch
STOP_AFTER = 19  # epoch 1, step 8


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Weights and record of the uninterrupted run."""
    out = tmp_path_factory.mktemp("reference")
    record = train(dataclasses.replace(CONFIG, save_model=str(out / "model.pt")))
    return load_weights(out / "model.pt"), record


def _preempt(config: TrainConfig, monkeypatch, stop_after: int = STOP_AFTER) -> str:
    """Run `config` with a real SIGTERM after step `stop_after - 1`; return the one-line message.

    The ranks vote on the signal during the next step, so they stop after `stop_after`.
    """
    monkeypatch.setenv("HARNESS_TEST_SIGNAL", f"TERM@{stop_after - 1}")
    with pytest.raises(Preempted) as stopped:
        train(config)
    monkeypatch.delenv("HARNESS_TEST_SIGNAL")
    return str(stopped.value)


def test_preempted_run_resumes_exactly_and_counts_every_sample_once(tmp_path, monkeypatch, reference):
    checkpoints, results = tmp_path / "checkpoints", tmp_path / "results.jsonl"
    config = dataclasses.replace(
        CONFIG, checkpoint_dir=str(checkpoints), checkpoint_every=5, keep_checkpoints=2, results=str(results)
    )
    message = _preempt(config, monkeypatch)
    assert message == (
        f"stopped by SIGTERM after step {STOP_AFTER} of {TOTAL_STEPS}; checkpoint {checkpoints}/"
        f"step-{STOP_AFTER:08d} is written; resubmit with --resume auto to continue (exit status 3)"
    )
    assert checkpoint_steps(checkpoints) == [15, STOP_AFTER]  # every 5 steps and epoch ends, newest 2 kept
    assert records(results) == []  # an unfinished segment reports nothing

    record = train(dataclasses.replace(config, resume="auto", save_model=str(tmp_path / "model.pt")))
    reference_weights, reference_record = reference
    assert max_abs_difference(load_weights(tmp_path / "model.pt"), reference_weights) <= 1e-6
    assert record == records(results)[0]  # the one record, appended once
    assert (record["steps"], record["samples_seen"], record["segments"]) == (TOTAL_STEPS, TOTAL_STEPS * 128, 2)
    assert record["resumed_from_step"] == STOP_AFTER
    assert record["train_losses"] == pytest.approx(reference_record["train_losses"], rel=1e-9)
    assert record["eval_accuracy"] == reference_record["eval_accuracy"]
    # Timings cover this segment only: the warmup window starts at the resume point.
    assert record["timed_steps"] == TOTAL_STEPS - STOP_AFTER - record["timing_warmup_steps"]
    assert checkpoint_steps(checkpoints) == [30, TOTAL_STEPS]


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, monkeypatch, capsys, reference):
    checkpoints = tmp_path / "checkpoints"
    config = dataclasses.replace(CONFIG, checkpoint_dir=str(checkpoints), checkpoint_every=4)
    _preempt(config, monkeypatch)
    newest = checkpoints / f"step-{STOP_AFTER:08d}"
    model_file = newest / "model.pt"
    size = model_file.stat().st_size
    with open(model_file, "r+b") as handle:  # as a full disk or a killed copy leaves it
        handle.truncate(size // 2)
    (checkpoints / ".partial-step-00000020").mkdir()  # a writer killed mid-checkpoint leaves this
    capsys.readouterr()

    record = train(dataclasses.replace(config, resume="auto", save_model=str(tmp_path / "model.pt")))
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warning == (
        f"harness train: warning: skipping damaged checkpoint {newest} "
        f"(model.pt has {size // 2} bytes, {size} were written)"
    )
    assert record["resumed_from_step"] == 16  # the newest valid one
    assert max_abs_difference(load_weights(tmp_path / "model.pt"), reference[0]) <= 1e-6
    # Pruned to the newest 3 (the damaged 19 with them); the partial directory is cleared.
    assert checkpoint_steps(checkpoints) == [28, 32, TOTAL_STEPS]
    assert not any(name.startswith(".partial") for name in os.listdir(checkpoints))


def test_checkpoint_holds_everything_in_plain_files(tmp_path, monkeypatch):
    checkpoints = tmp_path / "checkpoints"
    _preempt(dataclasses.replace(CONFIG, checkpoint_dir=str(checkpoints)), monkeypatch, stop_after=13)
    newest = checkpoints / "step-00000013"
    manifest = json.loads((newest / "manifest.json").read_text())
    assert (manifest["step"], manifest["epoch"], manifest["step_in_epoch"]) == (13, 1, 2)
    assert manifest["run"] == {
        "world_size": 1,
        "global_batch": 128,
        "train_set_size": 1500,
        "steps_per_epoch": 11,
        "total_steps": TOTAL_STEPS,
        "task": {
            "spec": "images",
            "args": {**ImageOptions().as_dict(), "dropout": 0.25},
            "sha256": None,
        },
    }
    assert manifest["config"]["task_args"]["model"] == "cnn" and manifest["reason"] == "preempted"
    assert len(manifest["progress"]["train_losses"]) == 1 and sorted(manifest["files"]) == [
        "model.pt",
        "rank-00000.pt",
    ]
    state = load_weights(newest / "model.pt")
    assert state["optimizer"]["state"][0]["momentum_buffer"].shape == state["model"]["features.0.weight"].shape
    rank_state = load_weights(newest / "rank-00000.pt")
    assert rank_state["epoch_step_losses"][:, 1].sum().item() == 2 * 128  # two steps of the unfinished epoch
    assert set(rank_state["rng"]) == {"torch", "numpy", "python"}


def test_rng_states_round_trip():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    state = capture_rng_state()
    first = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_state(state)
    second = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1]) and first[2] == second[2]


LAYOUT = RunLayout(world_size=2, global_batch=256, train_set_size=1500, steps_per_epoch=5, total_steps=15)


def _checkpoint_of(config: TrainConfig) -> Checkpoint:
    """A checkpoint's manifest as `config`'s run would write it after step 1 (no files needed here)."""
    return Checkpoint(
        "ckpt/step-00000001",
        {
            "step": 1,
            "config": config.to_dict(),
            "checkpoint_format": BACKENDS[config.backend].checkpoint_format,
            "run": {
                "world_size": LAYOUT.world_size,
                "global_batch": LAYOUT.global_batch,
                "train_set_size": LAYOUT.train_set_size,
            },
        },
    )


@pytest.mark.parametrize(
    "saved, resumed, message",
    [
        (
            ("deepspeed", {"zero_stage": 2}),
            ("deepspeed", {"zero_stage": 3}),
            "was written with --zero-stage 2 but this run has --zero-stage 3",
        ),
        (
            ("horovod", {"fp16_compression": True}),
            ("horovod", {}),
            "was written with --hvd-fp16-compression True but this run has --hvd-fp16-compression False",
        ),
        (
            ("ddp", {}),
            ("horovod", {"fp16_compression": True}),  # ddp sent gradients uncompressed
            "was written with --hvd-fp16-compression False but this run has --hvd-fp16-compression True",
        ),
    ],
)
def test_resuming_with_another_value_of_an_option_that_changes_the_saved_state_is_refused(saved, resumed, message):
    checkpoint = _checkpoint_of(TrainConfig(backend=saved[0], backend_options=saved[1]))
    config = TrainConfig(backend=resumed[0], backend_options=resumed[1])
    with pytest.raises(UsageError, match=message):
        check_compatible(checkpoint, config, LAYOUT, BACKENDS[config.backend])


@pytest.mark.parametrize(
    "saved, resumed",
    [
        (("horovod", {"cycle_time_ms": 2.0}), ("horovod", {"cycle_time_ms": 5.0, "fusion_threshold_mb": 64.0})),
        (("ddp", {"bucket_cap_mb": 10.0}), ("ddp", {})),
        (("horovod", {"fp16_compression": True}), ("ddp", {})),  # ddp has no compression to compare
    ],
)
def test_speed_knobs_may_change_on_resume(saved, resumed):
    checkpoint = _checkpoint_of(TrainConfig(backend=saved[0], backend_options=saved[1]))
    config = TrainConfig(backend=resumed[0], backend_options=resumed[1])
    check_compatible(checkpoint, config, LAYOUT, BACKENDS[config.backend])
