"""Results that survive a killed job: a cut-short last line is skipped with one warning naming it, and
an empty or missing results file gets the same one-line answer (exit 2) from every command."""

from __future__ import annotations

import json

import pytest

import harness
from harness.cli import main
from harness.errors import UsageError
from harness.training.record import append_record
from tests.helpers.handmade_records import record

pytestmark = pytest.mark.timeout(120)

COMMANDS = {
    "report": lambda path, out: ["report", path],
    "plot": lambda path, out: ["plot", path, "--output", str(out / "fig")],
    "predict": lambda path, out: ["predict", "--site", "polaris", "--record", path, "--nodes", "1,2"],
}


def _measured(workers: int, throughput: float) -> dict:
    """A handmade record with what `harness predict --record` reads too (timed steps, gradient bytes)."""
    made = record("ddp", workers, throughput)
    made["step_breakdown"]["timed_steps"] = 10
    made["gradient_bytes"] = 4 * 1_200_000
    return made


def _cut_file(tmp_path) -> str:
    """Two whole records appended as the sweep appends them, then a third cut off mid-write."""
    path = str(tmp_path / "results.jsonl")
    for workers in (1, 2):
        append_record(path, _measured(workers, 1000.0 * workers))
    line = json.dumps(_measured(4, 3900.0), sort_keys=True)
    with open(path, "a") as handle:
        handle.write(line[: len(line) // 2])  # what a SIGKILL between two writes would leave
    return path


def test_append_record_writes_one_whole_line_per_record(tmp_path):
    path = str(tmp_path / "r.jsonl")
    append_record(path, record("ddp", 1, 10.0))
    append_record(path, record("ddp", 2, 20.0))
    lines = open(path).read().split("\n")
    assert lines[-1] == "" and [json.loads(line)["world_size"] for line in lines[:-1]] == [1, 2]


def test_read_results_skips_the_cut_line_and_names_it(tmp_path, capsys):
    path = _cut_file(tmp_path)
    records = harness.read_results([path])
    assert [r["world_size"] for r in records] == [1, 2]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and path in warning[0] and "line 3" in warning[0]


def test_a_continued_study_appends_after_the_cut_line_and_every_record_is_read(tmp_path, capsys):
    """The study's next job appends to the file its killed job cut: the new record gets a line of its
    own, and the cut line, no longer the last, is still only a warning."""
    path = _cut_file(tmp_path)
    append_record(path, _measured(8, 7000.0))
    append_record(path, _measured(16, 12000.0))
    records = harness.read_results([path])
    assert [r["world_size"] for r in records] == [1, 2, 8, 16]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and path in warning[0] and "line 3 is cut off" in warning[0]
    with open(path, "a") as handle:
        handle.write("not a record at all\n")
    append_record(path, _measured(32, 20000.0))
    with pytest.raises(UsageError, match="line 6 is not a JSON record"):  # damage, not a cut, still stops
        harness.read_results([path])


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_reads_a_cut_file(command, tmp_path, capsys):
    path = _cut_file(tmp_path)
    assert main(COMMANDS[command](path, tmp_path)) == 0
    err = capsys.readouterr().err
    assert "line 3" in err and "Traceback" not in err


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", ["empty", "missing"])
def test_empty_or_missing_results_same_answer_everywhere(command, kind, tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    if kind == "empty":
        path.write_text("")
    assert main(COMMANDS[command](str(path), tmp_path)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]
    assert ("holds no records" if kind == "empty" else "does not exist") in lines[0]


def test_read_results_api_raises_for_an_empty_file(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text("\n")
    with pytest.raises(UsageError, match="holds no records"):
        harness.read_results([str(path)])
