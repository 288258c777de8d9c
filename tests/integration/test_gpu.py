"""GPU paths: device placement, NCCL, the precision modes under every backend, several ranks on one
GPU, stopping on a preemption signal, the exact step breakdown. Marked `gpu`: deselected by
default, run by `make gpu-check` on a node with an NVIDIA GPU (where a missing GPU is a failure,
not a skip)."""

from __future__ import annotations

import json

import pytest
import torch

from harness.backends import BACKENDS
from harness.backends.torch_distributed import TorchDistributedBackend
from harness.errors import UsageError
from harness.process.accelerator import select_device
from harness.process.discovery import ClusterEnv
from harness.training.launch import launch_command
from tests.conftest import launch, run
from tests.helpers.backend_cases import ALL, DISTRIBUTED

pytestmark = pytest.mark.gpu
# Backends whose ranks talk through a torch.distributed process group (gloo or NCCL).
PROCESS_GROUP = [name for name in DISTRIBUTED if issubclass(BACKENDS[name], TorchDistributedBackend)]
SHORT = [
    "--model",
    "resnet18",
    "--dataset",
    "synthetic",
    "--batch-size",
    "32",
    "--max-steps",
    "12",
    "--timing-warmup-steps",
    "4",
    "--eval-every",
    "0",
    "--calibration-steps",
    "4",
]


@pytest.fixture(autouse=True)
def _a_gpu_is_required():
    assert torch.cuda.is_available(), "make gpu-check needs an NVIDIA GPU visible to torch (CUDA_VISIBLE_DEVICES?)"


def _cluster(local_rank: int, local_size: int) -> ClusterEnv:
    return ClusterEnv(local_rank, local_size, local_rank, local_size, "127.0.0.1", 29500, "torchrun")


def test_each_rank_gets_its_gpu_or_shares_one_with_procs_per_gpu():
    gpus = torch.cuda.device_count()
    assert select_device("auto", _cluster(0, 1)) == torch.device("cuda", 0)
    assert select_device("auto", _cluster(1, 2), procs_per_gpu=2) == torch.device("cuda", 0)
    assert select_device("auto", _cluster(3, 4), procs_per_gpu=2) == torch.device("cuda", 1 % gpus)
    if gpus > 1:
        assert select_device("auto", _cluster(1, 2)) == torch.device("cuda", 1)
        with pytest.raises(UsageError, match="need"):
            select_device("auto", _cluster(0, 4 * gpus + 1), procs_per_gpu=4)


def _record(tmp_path, ranks: int, backend: str, flags) -> dict:
    results = tmp_path / f"{backend}-{ranks}.jsonl"
    launch(ranks, backend, [*SHORT, *flags, "--results", str(results)], timeout=900)
    return json.loads(results.read_text().splitlines()[-1])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("backend", ALL)
def test_every_backend_trains_on_one_gpu_in_every_precision(tmp_path, backend, precision):
    record = _record(tmp_path, 1, backend, ["--precision", precision, "--channels-last"])
    assert record["device"] == "cuda" and record["throughput"] > 0
    assert record["math"]["precision"] == precision
    gpu = record["gpu"]
    assert gpu["name"] == torch.cuda.get_device_name(0) and gpu["cuda"] == torch.version.cuda
    assert gpu["ranks_per_gpu"] == 1 and gpu["channels_last"] is True
    # Horovod and DeepSpeed communicate contiguous weights only; their images still go channels-last.
    assert record["tuning"]["channels_last_weights"] is BACKENDS[backend].channels_last_weights
    assert record["memory"]["peak_bytes_per_rank"][0] > 0 and record["memory"]["source"] == "cuda_allocator"
    if backend in PROCESS_GROUP:
        assert record["tuning"]["process_group"] == "nccl"


@pytest.mark.parametrize("backend", PROCESS_GROUP)
def test_two_ranks_share_one_gpu_through_gloo(tmp_path, backend):
    record = _record(tmp_path, 2, backend, ["--procs-per-gpu", "2", "--device", "cuda", "--dropout", "0"])
    assert record["world_size"] == 2 and record["gpu"]["ranks_per_gpu"] == 2
    assert record["tuning"]["process_group"] == "gloo"  # NCCL refuses two ranks on one GPU


@pytest.mark.parametrize("backend", ALL)
def test_a_signal_stops_every_backend_one_step_later_on_gpu(tmp_path, backend):
    # The vote on the signal reaches the host through a side stream on GPUs (harness.process.preemption).
    checkpoints = tmp_path / "checkpoints"
    stopped = run(
        launch_command(1, backend, [*SHORT, "--checkpoint-dir", str(checkpoints)]),
        timeout=600,
        env={"HARNESS_TEST_SIGNAL": "TERM@5"},
    )
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "after step 6 of 12" in stopped.stderr + stopped.stdout
    assert (checkpoints / "step-00000006").is_dir()


def test_profile_gives_an_exact_breakdown_on_gpu(tmp_path):
    record = _record(tmp_path, 1, "ddp", ["--profile"])
    breakdown = record["step_breakdown"]
    assert breakdown["exact"] is True
    per_step = breakdown["seconds_per_step"]
    parts = sum(per_step[k] for k in ("data_wait", "forward_backward", "communication", "optimizer", "other"))
    assert parts == pytest.approx(per_step["runtime"])


def test_two_gpus_one_rank_each_over_nccl(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU on this node: NCCL across GPUs needs two")
    record = _record(tmp_path, 2, "ddp", [])
    assert record["world_size"] == 2 and record["tuning"]["process_group"] == "nccl"
