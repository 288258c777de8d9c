"""Bad input: one line that names the fix, exit status 2, before any process group starts.

The command runs in this process (harness.cli.main, what `python -m harness` calls);
tests/integration/test_bad_input_cli.py shows the same through the command in a process of its own."""

from __future__ import annotations

import dataclasses

import pytest

from harness.backends import BACKENDS
from tests.helpers.cli import run_cli

CASES = [
    (["train", "--backend", "dpp"], "unknown backend 'dpp'; choose one of none, ddp, horovod, deepspeed, fsdp"),
    (["train", "--model", "vgg"], "unknown model 'vgg'; choose one of cnn, resnet18, resnet50"),
    (["train", "--dataset", "imagenet21k"], "unknown dataset 'imagenet21k'; choose one of"),
    (["train", "--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
    (["train", "--epochs", "-1"], "--epochs must be a positive integer"),
    (["train", "--max-steps", "0"], "--max-steps must be a positive integer"),
    (["train", "--lr", "0"], "--lr must be positive"),
    (["train", "--batch-size", "many"], "invalid int value: 'many'"),
    (["train", "--optimizer", "lamb"], "unknown optimizer 'lamb'; choose one of sgd, adam"),
    (["train", "--backend", "deepspeed", "--zero-stage", "4"], "--zero-stage must be 0, 1, 2 or 3"),
    (["train", "--backend", "deepspeed", "--zero-bucket-mb", "0"], "--zero-bucket-mb must hold at least one float32"),
    (
        ["train", "--backend", "deepspeed", "--zero-sub-group-mb", "16"],
        "--zero-sub-group-mb is ZeRO-3's: give it with",
    ),
    (
        ["train", "--backend", "deepspeed", "--zero-stage", "2", "--zero-gathered-mb", "4"],
        "--zero-gathered-mb is ZeRO-3's: give it with --zero-stage 3",
    ),
    (["train", "--backend", "horovod", "--hvd-cycle-time-ms", "0"], "--hvd-cycle-time-ms must be positive, got 0"),
    (["train", "--cpu-malloc", "jemalloc"], "unknown cpu-malloc 'jemalloc'; choose one of reuse, system"),
    (["train", "--batch-size", "4096"], "fewer than one global batch"),
    (
        ["launch", "-n", "2", "--backend", "deepspeed", "--", "--global-batch", "63"],
        "--global-batch 63 does not split evenly over 2 workers; use a multiple of 2",
    ),
    (["launch", "-n", "2", "--backend", "none"], "runs one process; use -n 1"),
    (["launch", "-n", "2", "--backend", "ddp", "--launcher", "srun"], "unknown launcher 'srun'"),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line_with_status_2(args, message, tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    is_train = args[0] == "train"
    status, lines = run_cli(capsys, [*args, *(["--results", str(results)] if is_train else [])])
    assert status == 2, lines
    assert len(lines) == 1 and message in lines[0], lines
    assert not results.exists()


def _option_flags_under_another_backend():
    """(option flag with a value, its backend, another backend) for every option of every registered backend."""
    cases = []
    for backend, cls in BACKENDS.items():
        other = next(name for name in BACKENDS if name != backend)
        for spec in dataclasses.fields(cls.Options):
            flag = [spec.metadata["flag"]] if spec.type in ("bool", bool) else [spec.metadata["flag"], "1"]
            cases.append(pytest.param(flag, backend, other, id=f"{spec.metadata['flag']} with {other}"))
    return cases


@pytest.mark.parametrize("flag, owner, other", _option_flags_under_another_backend())
def test_a_backends_option_flag_under_another_backend_names_the_fix(tmp_path, flag, owner, other, capsys):
    results = tmp_path / "results.jsonl"
    for command in (
        ["train", "--backend", other, *flag, "--results", str(results)],
        ["launch", "-n", "1", "--backend", other, "--dry-run", "--", *flag],
    ):
        status, lines = run_cli(capsys, command)
        assert status == 2, lines
        (line,) = lines
        assert line.endswith(f"error: {flag[0]} is a {owner} option; drop it or use --backend {owner}"), line
    assert not results.exists()


def test_rank_count_mismatch_for_single_process_backend(monkeypatch, capsys):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    status, lines = run_cli(capsys, ["train", "--backend", "none"])
    assert status == 2
    assert "backend 'none' runs one process but the launcher started 2" in "\n".join(lines)
