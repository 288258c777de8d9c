"""`harness predict` on bad input: one line naming the fix, exit 2, nothing written; a results file
whose last line was cut off is read up to that line, with a warning naming it."""

from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.training.record import read_results
from tests.helpers.handmade_records import record

PUBLISHED = ["predict", "--site", "polaris", "--throughput", "2470", "--batch-size", "256"]
GRADIENT = ["--gradient-bytes", "102228128"]


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--throughput", "-5"], "--throughput must be positive, got -5"),
        (["--throughput", "0"], "--throughput must be positive, got 0"),
        (["--batch-size", "0"], "--batch-size must be positive, got 0"),
        (["--batch-size", "-256"], "--batch-size must be positive, got -256"),
        (["--gradient-bytes", "-1"], "--gradient-bytes must be positive"),
        (["--ranks-per-node", "0"], "--ranks-per-node must be positive"),
        (["--bucket-mb", "-25"], "--bucket-mb must be positive"),
        (["--nodes", "0,2"], "--nodes takes positive node counts, e.g. --nodes 1,2,4; got '0,2'"),
        (["--nodes", "-4"], "--nodes takes positive node counts"),
        (["--nodes", "two"], "--nodes takes positive node counts"),
    ],
)
def test_counts_and_rates_below_one_are_refused_and_nothing_is_written(tmp_path, capsys, flags, named):
    out = tmp_path / "prediction.json"
    assert main([*PUBLISHED, *GRADIENT, *flags, "--json", str(out)]) == 2
    assert named in _error_line(capsys)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_file_of_another_kind_for_network_names_the_benchmark(tmp_path, capsys):
    runs = tmp_path / "results.jsonl"
    runs.write_text(json.dumps(record("ddp", 2, 100.0)) + "\n")
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"name": "x", "network": {}}))
    for path in (runs, profile, tmp_path / "missing.json", tmp_path):
        assert main([*PUBLISHED, *GRADIENT, "--network", str(path)]) == 2
        line = _error_line(capsys)
        assert str(path) in line and "`harness bench allreduce --results FILE`" in line


def _runs_file(tmp_path, cut: bool, bad_middle: bool = False):
    lines = []
    for world_size, runtime in ((1, 0.075), (1, 0.077), (2, 0.1)):
        run = record("ddp", world_size, 100.0 * world_size)
        run["step_breakdown"]["seconds_per_step"] = {
            "runtime": runtime,
            "forward_backward": 0.06,
            "optimizer": 0.01,
            "data_wait": 0.002,
            "other": 0.003,
            "communication": 0.0,
        }
        run["step_breakdown"]["timed_steps"] = 10
        run.update(local_world_size=1, gradient_bytes=4_799_528, tuning={"bucket_cap_mb": 25.0})
        lines.append(json.dumps(run))
    if bad_middle:
        lines.insert(1, "{not json")
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(lines) + "\n" + ('{"backend": "ddp", "world_si' if cut else ""))
    return path


def test_a_cut_off_last_line_is_left_out_with_a_warning_naming_it(tmp_path, capsys):
    path = _runs_file(tmp_path, cut=True)
    records = read_results([str(path)])
    assert [r["world_size"] for r in records] == [1, 1, 2]
    err = capsys.readouterr().err
    assert f"results file {path} line 4 is cut off" in err and err.count("\n") == 1
    out = tmp_path / "p.json"
    assert main(["predict", "--site", "polaris", "--record", str(path), "--nodes", "1,2", "--json", str(out)]) == 0
    assert "line 4 is cut off" in capsys.readouterr().err
    assert [row["nodes"] for row in json.loads(out.read_text())["predicted"]] == [1, 2]


def test_a_bad_line_before_the_last_is_an_error_naming_it(tmp_path, capsys):
    path = _runs_file(tmp_path, cut=False, bad_middle=True)
    out = tmp_path / "p.json"
    assert main(["predict", "--site", "polaris", "--record", str(path), "--json", str(out)]) == 2
    assert f"results file {path} line 2 is not a JSON record; remove that line" in _error_line(capsys)
    assert not out.exists()
