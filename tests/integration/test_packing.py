"""Packing with real processes: a stand-in MPS daemon started and stopped, a packing study through torchrun."""

from __future__ import annotations

import os

from harness.workshop.packing import (
    MPS_VARIABLES,
    Packing,
    mps_daemon,
    packing_rows,
    run_packing_study,
)
from tests.unit.test_packing import _fake_control


def test_mps_daemon_is_started_privately_for_the_block_and_quit_after(monkeypatch, tmp_path):
    monkeypatch.delenv(MPS_VARIABLES[0], raising=False)
    monkeypatch.delenv(MPS_VARIABLES[1], raising=False)
    control = _fake_control(tmp_path, 0)
    with mps_daemon(1, control=control) as state:
        assert state.running
        pipes = os.environ[MPS_VARIABLES[0]]
        assert os.path.isdir(pipes) and os.path.isdir(os.environ[MPS_VARIABLES[1]])
    assert MPS_VARIABLES[0] not in os.environ and MPS_VARIABLES[1] not in os.environ  # restored
    assert not os.path.exists(pipes)  # the private directory is gone
    assert (tmp_path / "calls.log").read_text().splitlines() == [f"start {pipes}", f"quit {pipes}"]


def test_mps_daemon_that_fails_to_start_is_reported_not_used(monkeypatch, tmp_path):
    monkeypatch.delenv(MPS_VARIABLES[0], raising=False)
    with mps_daemon(1, control=_fake_control(tmp_path, 1)) as state:
        assert not state.running and "exit 1" in state.reason and "cannot start" in state.reason
        assert MPS_VARIABLES[0] not in os.environ


def test_a_packing_study_records_each_placement(tmp_path):
    results = str(tmp_path / "packing.jsonl")
    plan = [Packing(ranks=1, threads=1, ranks_per_device=1, device="cpu")]
    study = run_packing_study(
        ["--max-steps", "3", "--batch-size", "16", "--eval-every", "0", "--timing-warmup-steps", "1"], results, plan
    )
    assert study["failed"] == [] and not study["mps"].running
    (record,) = study["records"]
    assert record["world_size"] == 1 and record["threads_per_rank"] == 1 and record["steps"] == 3
    assert record["tags"]["ranks_per_device"] == "1" and record["tags"]["mps"] == "off"
    assert packing_rows(study["records"])[0]["speedup"] == 1.0
