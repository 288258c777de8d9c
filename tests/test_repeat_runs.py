"""Any sequence of runs in one process behaves as if each were the first (notebook engines run
several): the record names the real launcher every time, no run's settings leak into the next,
every run trains the same weights, and a process group or Horovod the caller set up is used and
left as it was."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

import harness
from harness import TrainConfig
from harness.process.launchers import launcher_command
from harness.study.equivalence import UPDATE_BOUND, update_differences, worst
from harness.training.models import build_model

from .backend_cases import DISTRIBUTED
from .conftest import REPO, run

SCRIPT = os.path.join(REPO, "tests", "repeat_runs.py")
COMMON = dict(
    model="cnn",
    dataset="digits",
    dropout=0.0,
    seed=0,
    lr=0.05,
    lr_scaling="none",
    max_steps=10,
    threads=1,
    eval_every=0,
    calibration_steps=0,
    timing_warmup_steps=1,
)
# What repeat_runs.py runs first, in processes of their own: every distributed backend, then each again.
SEQUENCE = DISTRIBUTED * 2
# The knobs of the first run of these backends in a fresh process, as they apply them.
FIRST_RUN_TUNING = {
    "ddp": {
        "bucket_cap_mb": 25.0,
        "gradient_as_bucket_view": True,
        "process_group": "gloo",
        "gradient_allreduce": True,
    },
    "horovod": {"fusion_threshold_mb": 128.0, "cycle_time_ms": 5.0, "fp16_compression": False},
    "deepspeed": {
        "zero_stage": 0,
        "process_group": "gloo",
        "throughput_timer": False,
        "gradient_allreduce": True,
        "zero_reduce_bucket_elements": 500_000_000,
        "zero_allgather_bucket_elements": 500_000_000,
    },
}


def _max_difference(first: dict, second: dict) -> float:
    return max((first[key] - second[key]).abs().max().item() for key in first)


def _update_difference(weights: dict, reference: dict) -> float:
    torch.manual_seed(0)
    return worst(update_differences(weights, reference, build_model("cnn", 1, 28, 10, 0.0).state_dict()))[1]


@pytest.mark.slow
def test_backends_one_after_another_in_the_same_two_mpi_processes(tmp_path):
    result = run(launcher_command("mpirun", 2, [SCRIPT, str(tmp_path)]), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    reference_path = tmp_path / "reference.pt"
    harness.train(TrainConfig(batch_size=32, save_model=str(reference_path), **COMMON))
    reference = torch.load(reference_path, weights_only=True)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert [entry["backend"] for entry in seen] == [*SEQUENCE, "ddp", "deepspeed", "deepspeed", "horovod"]
        for entry in seen:
            assert entry["launcher"] == "openmpi", entry
            weights = torch.load(entry["weights"], weights_only=True)
            assert _update_difference(weights, reference) <= UPDATE_BOUND, entry
        first_tuning = {}
        for entry in seen[: len(SEQUENCE)]:
            # A backend's later run applies the knobs its first run did: nothing a run set leaked.
            assert entry["tuning"] == first_tuning.setdefault(entry["backend"], entry["tuning"]), entry
            assert entry["left_behind"] == [], entry
            assert entry["train_function"].startswith("<function train")
        assert {backend: first_tuning[backend] for backend in FIRST_RUN_TUNING} == {
            backend: {
                **tuning,
                "cpu_malloc": "reuse",
                "channels_last_weights": False,
                "compile": None,
                "heartbeat": True,
            }
            for backend, tuning in FIRST_RUN_TUNING.items()
        }
        assert all(entry["kept"] for entry in seen[len(SEQUENCE) :]), seen[len(SEQUENCE) :]


def test_the_single_process_backend_twice_in_this_process(tmp_path):
    before = dict(os.environ), torch.get_num_threads()
    records = [
        harness.train(TrainConfig(batch_size=32, save_model=str(tmp_path / f"{n}.pt"), **COMMON)) for n in range(2)
    ]
    assert (dict(os.environ), torch.get_num_threads()) == before
    assert [r["launcher"] for r in records] == ["none", "none"]
    assert records[0]["train_losses"] == records[1]["train_losses"]
    first, second = (torch.load(tmp_path / f"{n}.pt", weights_only=True) for n in range(2))
    assert _max_difference(first, second) == 0.0
    from harness import train

    assert callable(train) and train is harness.train and callable(sys.modules["harness"].train)
