"""The files a run writes at its end are checked before it trains: `--save-model run/model.pt` where
`run` is a file once trained to the end and died with a FileExistsError traceback (exit 1), losing
the model. Now it is one line before any training (UsageError, exit 2), and nothing is created."""

from __future__ import annotations

import os

import pytest

from harness.config import TrainConfig
from harness.errors import UsageError
from harness.training.placement import check_config, check_output_file
from tests.helpers.unprivileged import as_unprivileged_user, searchable_tmp_dir


def test_a_model_or_results_path_through_a_file_is_refused_before_training(tmp_path):
    run = tmp_path / "run"
    run.write_text("not a directory\n")
    for flag, field in (("--save-model", "save_model"), ("--results", "results")):
        config = TrainConfig(**{field: str(run / "out" / "model.pt")})
        with pytest.raises(UsageError) as raised:
            check_config(config)
        assert str(raised.value) == (
            f"{flag} {run / 'out' / 'model.pt'} cannot be written: {run} is a file, not a directory; "
            "choose another path"
        )
    assert sorted(os.listdir(tmp_path)) == ["run"]  # nothing made


def test_a_directory_is_not_a_file_to_write(tmp_path):
    with pytest.raises(UsageError, match=r"--save-model .* is a directory; give a file path"):
        check_config(TrainConfig(save_model=str(tmp_path)))


def test_paths_still_to_be_made_and_existing_files_pass(tmp_path):
    (tmp_path / "results.jsonl").write_text("")
    check_config(
        TrainConfig(save_model=str(tmp_path / "a" / "b" / "model.pt"), results=str(tmp_path / "results.jsonl"))
    )
    assert sorted(os.listdir(tmp_path)) == ["results.jsonl"]


def test_a_directory_that_denies_writing_is_named():
    # As root too: root may write anywhere, so the check runs as nobody here (see the helper).
    with searchable_tmp_dir() as base:
        locked, open_ = base / "locked", base / "open"
        locked.mkdir()
        locked.chmod(0o555)
        open_.mkdir()
        open_.chmod(0o777)
        with as_unprivileged_user():
            check_output_file("--results", str(open_ / "r.jsonl"), replaced=False)  # the same user may write here
            with pytest.raises(
                UsageError, match=rf"--results {locked / 'r.jsonl'} is not writable \({locked} denies it\)"
            ):
                check_output_file("--results", str(locked / "r.jsonl"), replaced=False)
