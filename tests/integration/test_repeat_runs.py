"""Every backend one after another in the same two MPI processes, as a notebook's engines run them."""

from __future__ import annotations

import json
import os

import pytest

import harness
from harness import TrainConfig
from harness.process.launchers import launcher_command
from harness.study.scaling.equivalence import UPDATE_BOUND
from tests.conftest import REPO, run
from tests.helpers.backend_cases import DISTRIBUTED
from tests.helpers.weights import load_weights, update_difference
from tests.unit.test_repeat_runs import COMMON

# What repeat_runs.py runs first, in processes of their own: every distributed backend, then each again.
SEQUENCE = DISTRIBUTED * 2

SCRIPT = os.path.join(REPO, "tests", "helpers", "repeat_runs.py")

# The knobs of the first run of these backends in a fresh process, as they apply them.
FIRST_RUN_TUNING = {
    "ddp": {
        "bucket_cap_mb": 25.0,
        "find_unused_parameters": False,
        "gradient_as_bucket_view": True,
        "process_group": "gloo",
        "gradient_allreduce": True,
        "comm_hook": "default allreduce_hook (metered)",  # DDP's allreduce, timed (harness.backends.ddp)
    },
    "horovod": {"fusion_threshold_mb": 128.0, "cycle_time_ms": 5.0, "fp16_compression": False},
    "deepspeed": {
        "zero_stage": 0,
        "process_group": "gloo",
        "throughput_timer": False,
        "gradient_allreduce": True,
        "zero_reduce_bucket_elements": 500_000_000,
        "zero_allgather_bucket_elements": 500_000_000,
        "zero_sub_group_elements": 1_000_000_000,
        "zero_max_live_elements": 1_000_000_000,
        "zero_max_reuse_elements": 1_000_000_000,
        "zero_prefetch_elements": 50_000_000,
    },
}


@pytest.mark.slow
def test_backends_one_after_another_in_the_same_two_mpi_processes(tmp_path):
    result = run(launcher_command("mpirun", 2, [SCRIPT, str(tmp_path)]), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    reference_path = tmp_path / "reference.pt"
    harness.train(TrainConfig(batch_size=32, save_model=str(reference_path), **COMMON))
    reference = load_weights(reference_path)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert [entry["backend"] for entry in seen] == [*SEQUENCE, "ddp", "deepspeed", "deepspeed", "horovod"]
        for entry in seen:
            assert entry["launcher"] == "openmpi", entry
            assert update_difference(load_weights(entry["weights"]), reference) <= UPDATE_BOUND, entry
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
                "pinned_cores": None,
                "channels_last_weights": False,
                "compile": None,
                "heartbeat": True,
            }
            for backend, tuning in FIRST_RUN_TUNING.items()
        }
        assert all(entry["kept"] for entry in seen[len(SEQUENCE) :]), seen[len(SEQUENCE) :]
