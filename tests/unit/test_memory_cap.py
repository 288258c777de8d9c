"""--memory-cap, in this process: the kernel's data-segment limit set for the run and put back after
it, an allocation past it turned into one line naming the rank, and the two kinds of bad input (a cap
below the runtime's own footprint, a run predicted to need more than the cap) refused before training."""

from __future__ import annotations

import resource

import pytest
import torch

from harness import TrainConfig, train
from harness.errors import UsageError
from harness.process.memory_cap import GIB, MemoryCap, capped, data_segment_bytes
from tests.helpers.cli import run_cli
from tests.helpers.memory_tasks import TASK_FILE

CPU = torch.device("cpu")


def test_the_cap_is_the_kernels_limit_while_the_block_runs_and_is_put_back_after_it():
    before = resource.getrlimit(resource.RLIMIT_DATA)
    cap_gib = (data_segment_bytes() + 0.25 * GIB) / GIB
    with capped(cap_gib, CPU) as cap:
        assert resource.getrlimit(resource.RLIMIT_DATA)[0] == cap.cap_bytes == int(cap_gib * GIB)
        with pytest.raises(RuntimeError) as refused:
            torch.ones(int(0.5 * GIB) // 4)  # past the cap: the allocation fails, nothing is killed
        over = cap.over_budget(refused.value, "ddp", rank=3)
        assert over is not None and str(over).startswith("rank 3 ran out of its memory cap under ddp")
        assert f"{cap_gib:.2f} GiB" in str(over) and "--backend fsdp" in str(over)
        assert cap.over_budget(ValueError("a task's own bug"), "ddp", rank=3) is None
    assert resource.getrlimit(resource.RLIMIT_DATA) == before
    with capped(None, CPU) as none:
        assert none is None and resource.getrlimit(resource.RLIMIT_DATA) == before


def test_a_cap_below_the_runtimes_footprint_is_refused_naming_the_footprint(capsys):
    status, lines = run_cli(capsys, ["train", "--memory-cap", "0.05", "--max-steps", "1"])
    assert status == 2 and len(lines) == 1
    assert "--memory-cap 0.05 GiB is below this rank's runtime footprint of" in lines[0]


def test_the_check_says_what_a_rank_needs_and_the_cap_in_one_line():
    cap = MemoryCap(int(1.5 * GIB), int(0.75 * GIB), "RLIMIT_DATA")
    cap.check(0.7 * GIB, "ddp", rank=0)  # fits: 1.45 GiB
    with pytest.raises(UsageError) as refused:
        cap.check(1.0 * GIB, "ddp", rank=1)
    assert str(refused.value).startswith("needs 1.75 GiB a rank under ddp; the cap is 1.50 GiB (rank 1:")
    assert "\n" not in str(refused.value)


def test_a_run_predicted_past_its_cap_is_refused_before_training_and_the_limit_put_back():
    """Adam's two copies of 128 MiB of weights are in the prediction, not in the probe: the probe's
    forward and backward fit under the cap, the predicted run does not."""
    before = resource.getrlimit(resource.RLIMIT_DATA)
    config = TrainConfig(
        task=f"{TASK_FILE}:wide",
        task_args={"layers": 8},
        optimizer="adam",
        batch_size=4,
        max_steps=2,
        memory_cap=(data_segment_bytes() + 0.4 * GIB) / GIB,
    )
    with pytest.raises(UsageError) as refused:
        train(config)
    assert " a rank under none; the cap is " in str(refused.value) and "rank 0:" in str(refused.value)
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


def test_a_run_that_would_not_fit_even_fully_sharded_is_told_so_not_told_to_shard():
    cap = MemoryCap(int(1.5 * GIB), int(0.75 * GIB), "RLIMIT_DATA")
    with pytest.raises(UsageError) as shardable:
        cap.check(1.0 * GIB, "ddp", rank=0, sharded_bytes=0.5 * GIB)
    assert "shard the model (--backend fsdp" in str(shardable.value)
    with pytest.raises(UsageError) as too_large:
        cap.check(2.0 * GIB, "ddp", rank=0, sharded_bytes=1.0 * GIB)
    assert "even fully sharded (fsdp) a rank needs 1.75 GiB: add ranks" in str(too_large.value)
    assert "shard the model" not in str(too_large.value)


def test_the_fix_named_is_a_backend_that_holds_less_than_the_one_that_ran():
    from harness.process.memory_cap import shard_hint

    both = "shard the model (--backend fsdp, or --backend deepspeed --zero-stage 3), add ranks, or raise --memory-cap"
    assert shard_hint("ddp") == shard_hint("deepspeed zero_stage=1") == both
    assert shard_hint("deepspeed zero_stage=3 zero_bucket_mb=4.0 zero_sub_group_mb=16.0 zero_gathered_mb=4.0") == (
        "shard the model (--backend fsdp), add ranks, or raise --memory-cap"
    )
    assert shard_hint("deepspeed zero_stage=3").startswith(
        "step the optimizer in smaller sub-groups (--zero-sub-group-mb 16), keep fewer weights gathered "
        "(--zero-gathered-mb 4), shard the model (--backend fsdp)"
    )
    assert shard_hint("deepspeed zero_stage=3 zero_sub_group_mb=16.0").startswith(
        "keep fewer weights gathered (--zero-gathered-mb 4), shard the model"
    )
    assert shard_hint("fsdp") == shard_hint("fsdp keep_gathered=True") == "add ranks, or raise --memory-cap"
