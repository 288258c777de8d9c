"""A run's last writes (--save-model, --results) that fail at the end keep the run's work elsewhere
and say where in one line; where nothing can be written, the first error is raised."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch

from harness.fileio import load_tensors
from harness.training.outputs import KEPT_DIRECTORY, save_model, save_record


@pytest.fixture
def node_tmp(tmp_path, monkeypatch):
    """TMPDIR of its own: the last place the work goes."""
    directory = tmp_path / "node-tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def test_a_model_that_cannot_be_saved_goes_beside_the_results(tmp_path, node_tmp, capsys):
    (tmp_path / "gone").write_text("")  # the model's directory is a file now: the write fails
    results = tmp_path / "runs" / "results.jsonl"
    results.parent.mkdir()
    asked = tmp_path / "gone" / "model.pt"
    kept = save_model(str(asked), {"w": torch.ones(3)}, str(results))
    assert kept == str(results.parent / f"model.pt.kept-{os.getpid()}")
    assert torch.equal(load_tensors(kept)["w"], torch.ones(3))
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"harness train: warning: --save-model {asked} could not be written (")
    assert line.endswith(f"the model is kept in {kept}") and "\n" not in line


def test_a_record_with_nowhere_beside_goes_to_the_nodes_tmp(tmp_path, node_tmp, capsys):
    (tmp_path / "gone").write_text("")
    asked = tmp_path / "gone" / "results.jsonl"
    kept = save_record(str(asked), {"backend": "ddp"}, None)
    assert kept == str(node_tmp / KEPT_DIRECTORY / f"results.jsonl.kept-{os.getpid()}")
    assert [json.loads(line) for line in open(kept)] == [{"backend": "ddp"}]
    assert f"the run's record is kept in {kept}" in capsys.readouterr().err


def test_a_write_that_works_says_nothing(tmp_path, node_tmp, capsys):
    results = tmp_path / "results.jsonl"
    assert save_record(str(results), {"backend": "fsdp"}, None) == str(results)
    assert capsys.readouterr().err == "" and not os.listdir(node_tmp)


def test_where_nothing_can_be_written_the_first_error_is_raised(tmp_path, monkeypatch):
    (tmp_path / "gone").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone" / "tmp"))  # under a file too
    with pytest.raises(FileExistsError) as raised:  # makedirs of the results file's directory, the first error
        save_record(str(tmp_path / "gone" / "results.jsonl"), {"backend": "ddp"}, None)
    assert str(tmp_path / "gone") in str(raised.value)
