"""Bad input around checkpoints, resume and launch variables: one line naming the fix, status 2,
nothing appended to --results.

A table of flags, environment variables, files and checkpoint contents (test_errors.py covers
the basic training flags). Cases run `harness.cli.main` in-process, the function the `harness`
script runs, so the table stays fast; the last test runs one case as a real process.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable, NamedTuple

import pytest
import torch

from harness import TrainConfig, train
from harness.cli import main

TRAIN = [
    "train",
    "--threads",
    "1",
    "--batch-size",
    "128",
    "--max-steps",
    "8",
    "--seed",
    "7",
    "--lr",
    "0.02",
    "--eval-every",
    "0",
    "--calibration-steps",
    "0",
]


class Case(NamedTuple):
    name: str
    message: str  # a part of the one line the user sees
    args: Callable[[Path, Path], list[str]] = lambda tmp, checkpoints: []  # gets a private copy of the checkpoints
    env: dict[str, str] = {}


class Exploit:
    """A pickle that runs code when loaded without weights_only."""

    def __reduce__(self):
        return (print, ("EXPLOIT RAN",))


def _step(checkpoints: Path, step: int) -> Path:
    return checkpoints / f"step-{step:08d}"


def _edit_manifest(checkpoint: Path, edit: Callable[[dict], None]) -> None:
    path = checkpoint / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _truncated(tmp: Path, checkpoints: Path) -> list[str]:
    model = _step(checkpoints, 2) / "model.pt"
    model.write_bytes(model.read_bytes()[:1000])
    return ["--resume", str(_step(checkpoints, 2))]


def _garbled_manifest(tmp: Path, checkpoints: Path) -> list[str]:
    (_step(checkpoints, 2) / "manifest.json").write_text("{not json")
    return ["--resume", str(_step(checkpoints, 2))]


def _other_format_version(tmp: Path, checkpoints: Path) -> list[str]:
    _edit_manifest(_step(checkpoints, 2), lambda manifest: manifest.update(format_version=99))
    return ["--resume", str(_step(checkpoints, 2))]


def _four_ranks(tmp: Path, checkpoints: Path) -> list[str]:
    _edit_manifest(_step(checkpoints, 2), lambda manifest: manifest["run"].update(world_size=4))
    return ["--resume", str(_step(checkpoints, 2))]


def _other_dataset_size(tmp: Path, checkpoints: Path) -> list[str]:
    _edit_manifest(_step(checkpoints, 2), lambda manifest: manifest["run"].update(train_set_size=60000))
    return ["--resume", str(_step(checkpoints, 2))]


def _pickled_code(tmp: Path, checkpoints: Path) -> list[str]:
    checkpoint = _step(checkpoints, 2)
    torch.save({"model": Exploit()}, checkpoint / "model.pt")
    data = (checkpoint / "model.pt").read_bytes()
    # A consistent manifest: the file passes verification and must be refused when it is loaded.
    _edit_manifest(
        checkpoint,
        lambda manifest: manifest["files"].update(
            {"model.pt": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
        ),
    )
    return ["--resume", str(checkpoint)]


def _flipped_byte(tmp: Path, checkpoints: Path) -> list[str]:
    model = _step(checkpoints, 2) / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot: same size, other content
    model.write_bytes(bytes(data))
    return ["--resume", str(_step(checkpoints, 2))]


def _no_file_list(tmp: Path, checkpoints: Path) -> list[str]:
    _edit_manifest(_step(checkpoints, 2), lambda manifest: manifest.pop("files"))
    return ["--resume", str(_step(checkpoints, 2))]


def _checkpoint_of_another_directory(tmp: Path, checkpoints: Path) -> list[str]:
    elsewhere = tmp / "elsewhere"
    shutil.copytree(checkpoints, elsewhere)
    return ["--checkpoint-dir", str(checkpoints), "--resume", str(_step(elsewhere, 2))]


def _missing_rank_file(tmp: Path, checkpoints: Path) -> list[str]:
    (_step(checkpoints, 2) / "rank-00000.pt").unlink()
    return ["--resume", str(_step(checkpoints, 2))]


def _a_file(tmp: Path, checkpoints: Path) -> list[str]:
    (tmp / "plain-file").write_text("")
    return ["--checkpoint-dir", str(tmp / "plain-file")]


def _resume(step: int, *extra: str) -> Callable[[Path, Path], list[str]]:
    return lambda tmp, checkpoints: ["--resume", str(_step(checkpoints, step)), *extra]


CASES = [
    # flags
    Case(
        "negative checkpoint interval",
        "--checkpoint-every must not be negative, got -5",
        lambda tmp, checkpoints: ["--checkpoint-every", "-5", "--checkpoint-dir", str(tmp / "new")],
    ),
    Case(
        "keep no checkpoints",
        "--keep-checkpoints must be a positive integer, got 0",
        lambda tmp, checkpoints: ["--keep-checkpoints", "0", "--checkpoint-dir", str(tmp / "new")],
    ),
    Case(
        "interval without directory",
        "--checkpoint-every needs --checkpoint-dir DIR",
        lambda tmp, checkpoints: ["--checkpoint-every", "10"],
    ),
    Case(
        "resume auto without directory",
        "--resume auto needs --checkpoint-dir DIR",
        lambda tmp, checkpoints: ["--resume", "auto"],
    ),
    Case(
        "resume from nowhere",
        "is not a checkpoint (no manifest.json in it); give a checkpoint directory",
        lambda tmp, checkpoints: ["--resume", str(tmp / "nowhere")],
    ),
    Case("checkpoint dir is a file", "is a file; give a directory", _a_file),
    Case("zero timeout", "--timeout must be positive, got 0.0", lambda tmp, checkpoints: ["--timeout", "0"]),
    Case(
        "non-numeric interval",
        "argument --checkpoint-every: invalid int value: 'two'",
        lambda tmp, checkpoints: ["--checkpoint-every", "two"],
    ),
    # environment variables
    Case(
        "malformed test signal",
        "HARNESS_TEST_SIGNAL='TERM-at-5' is not SIGNAL@STEP[:RANK] (e.g. TERM@5:1); fix it or unset it",
        env={"HARNESS_TEST_SIGNAL": "TERM-at-5"},
    ),
    Case(
        "rank outside the world",
        "RANK=3 is outside the world of size 2 (WORLD_SIZE); check the launcher's variables",
        env={"RANK": "3", "WORLD_SIZE": "2"},
    ),
    Case(
        "non-numeric world size",
        "environment variable WORLD_SIZE='two' is not an integer; unset it or fix the launcher",
        env={"RANK": "0", "WORLD_SIZE": "two"},
    ),
    Case("rank without world size", "RANK is set but no world size variable is", env={"RANK": "0"}),
    # files
    Case(
        "directory of another run",
        "already holds checkpoints (newest step-00000004); add --resume auto to continue "
        "that run, or choose an empty directory",
        lambda tmp, checkpoints: ["--checkpoint-dir", str(checkpoints)],
    ),
    Case("truncated checkpoint", "is damaged (model.pt has 1000 bytes", _truncated),
    Case("garbled manifest", "is damaged (manifest.json is unreadable", _garbled_manifest),
    Case(
        "manifest of another format",
        "is damaged (manifest.json is not a harness checkpoint manifest of format 1)",
        _other_format_version,
    ),
    Case("checkpoint without this rank's state", "is damaged (rank-00000.pt is missing)", _missing_rank_file),
    Case("flipped byte", "is damaged (model.pt does not match its checksum)", _flipped_byte),
    Case(
        "manifest without file list",
        "is damaged (manifest.json lacks its step, run facts or a well-formed file list)",
        _no_file_list,
    ),
    Case(
        "resume into another run's directory",
        "holds checkpoints of another run than --resume",
        _checkpoint_of_another_directory,
    ),
    # checkpoint contents
    Case(
        "another model",
        "was written with task arguments model='cnn' but this run has model='resnet18'; use the checkpoint's "
        "settings, or start a new run with another --checkpoint-dir",
        _resume(2, "--model", "resnet18"),
    ),
    Case("another learning rate", "was written with --lr 0.02 but this run has --lr 0.5", _resume(2, "--lr", "0.5")),
    Case(
        "another optimizer",
        "was written with --optimizer sgd but this run has --optimizer adam",
        _resume(2, "--optimizer", "adam"),
    ),
    Case("another seed", "was written with --seed 7 but this run has --seed 8", _resume(2, "--seed", "8")),
    Case(
        "another global batch",
        "was written with a global batch of 128 but this run has 64",
        _resume(2, "--batch-size", "64"),
    ),
    Case("another world size", "was written by 4 ranks but this job has 1", _four_ranks),
    Case(
        "another training set",
        "was written with a training set size of 60000 but this run has 1500",
        _other_dataset_size,
    ),
    Case(
        "another backend's format",
        "was written by backend none (torch format) and cannot be loaded by deepspeed; resume with --backend none",
        _resume(2, "--backend", "deepspeed"),
    ),
    Case(
        "pickled code instead of tensors", "cannot be loaded as plain tensors (Weights only load failed", _pickled_code
    ),
    Case(
        "run already finished",
        "is at step 4, the end of this run's 4 steps; nothing is left to train",
        _resume(4, "--max-steps", "4"),
    ),
]


@pytest.fixture(scope="module")
def saved_checkpoints(tmp_path_factory) -> Path:
    """Checkpoints after steps 2 and 4 of a 4-step run (the final one at its end)."""
    directory = tmp_path_factory.mktemp("saved") / "checkpoints"
    train(
        TrainConfig(
            batch_size=128,
            max_steps=4,
            seed=7,
            lr=0.02,
            threads=1,
            eval_every=0,
            calibration_steps=0,
            checkpoint_dir=str(directory),
            checkpoint_every=2,
        )
    )
    return directory


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_one_line_naming_the_fix_with_status_2(case, tmp_path, saved_checkpoints, monkeypatch, capsys):
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(saved_checkpoints, checkpoints)
    results = tmp_path / "results.jsonl"
    args = [*TRAIN, *case.args(tmp_path, checkpoints), "--results", str(results)]
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    try:
        status = main(args)
    except SystemExit as exit:  # argparse errors exit from inside the parser
        status = exit.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, captured.err
    assert len(lines) == 1 and case.message in lines[0], captured.err
    assert not results.exists()
    assert "EXPLOIT RAN" not in captured.out + captured.err
