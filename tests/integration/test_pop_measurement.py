"""POP measurement on real ranks: one rank of every backend, and two DDP ranks with a slow peer."""

from __future__ import annotations

import json
import os

import pytest

from harness.process.launchers import launcher_command
from harness.training.record import read_records
from tests.conftest import REPO, launch, run
from tests.helpers.backend_cases import ALL, with_options
from tests.helpers.sleepy_data import outside_window_seconds

# Alone: shares of the step's time are asserted (one rank's communication efficiency fell to 0.92 in a
# lane beside other tests), and an injected delay's attribution.
pytestmark = pytest.mark.alone


@pytest.mark.slow
@pytest.mark.parametrize("backend, flags", with_options(ALL))
def test_one_rank_communicates_nothing_on_every_backend(tmp_path, backend, flags):
    """Each backend and option set at one rank under its own launcher: its communication is near
    zero, busy machine or not (a collective a backend still issues alone costs next to nothing)."""
    results = tmp_path / "r.jsonl"
    launch(
        1,
        backend,
        [
            *flags,
            "--model",
            "cnn",
            "--dataset",
            "synthetic",
            "--batch-size",
            "32",
            "--max-steps",
            "25",
            "--timing-warmup-steps",
            "5",
            "--threads",
            "1",
            "--eval-every",
            "0",
            "--results",
            str(results),
        ],
    )
    record = read_records([str(results)])[0]
    per_step = record["step_breakdown"]["seconds_per_step"]
    assert per_step["communication"] < 0.05 * per_step["runtime"], (per_step, record["contention"])
    assert record["communication_efficiency"] >= 0.95, (per_step, record["contention"])


@pytest.mark.slow
def test_two_ddp_ranks_outside_clock_and_waiting_for_a_slow_peer(tmp_path):
    """Rank 1 sleeps 60 ms per fetch, rank 0 not at all: rank 0 spends that time in the allreduce."""
    slow = 0.06
    script = os.path.join(REPO, "tests", "helpers", "sleepy_data.py")
    flags = [
        "--backend",
        "ddp",
        "--model",
        "cnn",
        "--batch-size",
        "8",
        "--max-steps",
        "25",
        "--timing-warmup-steps",
        "5",
        "--threads",
        "1",
        "--eval-every",
        "0",
    ]
    result = run(
        launcher_command(
            "torchrun",
            2,
            [
                script,
                str(tmp_path),
                f"0,{slow * 1000:g}",
                *flags,
            ],
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    record = ranks[0]["record"]
    for rank in ranks:  # the window is barrier-bounded: either rank's clock sees the same window
        outside = outside_window_seconds(rank["stamps"], record["timing_warmup_steps"])
        assert record["throughput"] == pytest.approx(
            record["timed_steps"] * record["global_batch"] / outside, rel=0.02
        )
    steps = record["timed_steps"]
    per_rank = record["step_breakdown"]["per_rank_seconds"]
    communication = [seconds / steps for seconds in per_rank["communication"]]
    data_wait = [seconds / steps for seconds in per_rank["data_wait"]]
    assert data_wait[1] >= slow and data_wait[0] < 0.25 * slow
    assert communication[0] >= 0.6 * slow, communication
    assert communication[0] - communication[1] >= 0.4 * slow, communication
    # Both ranks compute the same work, so the load is balanced; the waiting costs efficiency.
    assert record["load_balance"] > 0.6
    assert record["communication_efficiency"] < 0.7
