"""`harness report` reads as a table: the table, one line per caveat of this study, and one line that
says where the definitions are (`--explain` prints them); a file with no run in it is one line, exit 2."""

from __future__ import annotations

import json

from harness.cli import main
from harness.study.scaling.report_notes import GLOSSARY
from harness.training.metrics import DEFINITIONS
from harness.training.record import append_record
from tests.helpers.handmade_records import record


def _two_rounds(path: str) -> None:
    for repeat in (0, 1):
        append_record(path, record("ddp", 1, 1000.0 + repeat, repeat=repeat))
        append_record(path, record("ddp", 2, 1800.0 - repeat, repeat=repeat))


def test_the_report_is_the_table_and_its_caveats_and_explain_adds_the_definitions(tmp_path, capsys):
    path = str(tmp_path / "results.jsonl")
    _two_rounds(path)
    assert main(["report", path]) == 0
    text = capsys.readouterr().out
    assert "1,800 [n/a (needs 3 rounds)]" in text  # ddp x2 over two rounds: no interval
    assert "n/a (needs 3 rounds): 2 of 2 row(s) ran in 2 round(s), too few for a 95% interval" in text
    assert text.count(GLOSSARY) == 1 and DEFINITIONS["AU"] not in text
    assert main(["report", path, "--explain"]) == 0
    explained = capsys.readouterr().out
    assert DEFINITIONS["AU"] in explained and DEFINITIONS["speedup"] in explained


def test_a_results_file_with_no_run_records_is_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps({"kind": "allreduce-benchmark", "fit": None}) + "\n")
    assert main(["report", str(path)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "holds no run records" in error[0] and "harness sweep --results FILE" in error[0]
