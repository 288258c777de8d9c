"""A job template's settings checked in-process."""

from __future__ import annotations

from harness.study.sweep import SweepSettings, plan_sweep


def test_sweep_accepts_checkpoint_every_with_a_checkpoint_root(tmp_path):
    # Every run of such a sweep gets a checkpoint directory, so --checkpoint-every is valid for it.
    runs = plan_sweep(
        SweepSettings(
            backends=["ddp"],
            ranks=[2],
            scaling="weak",
            results=str(tmp_path / "r.jsonl"),
            train_args=["--checkpoint-every", "5"],
            checkpoint_root=str(tmp_path / "ck"),
        ),
        environ={},
    )
    flags = runs[0].command
    assert flags[flags.index("--checkpoint-dir") + 1] == str(tmp_path / "ck" / "ddp-2r-rep0")
