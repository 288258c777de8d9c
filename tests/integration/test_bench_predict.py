"""harness predict and the allreduce benchmark through the CLI and real launchers."""

from __future__ import annotations

import json

import pytest

from tests.conftest import harness
from tests.unit.test_bench_predict import _measured_run


def test_predict_cli_with_a_published_throughput(tmp_path):
    out = tmp_path / "p.json"
    result = harness(
        "predict",
        "--site",
        "polaris",
        "--throughput",
        "2470",
        "--batch-size",
        "256",
        "--gradient-bytes",
        "102228128",
        "--nodes",
        "1,2,512",
        "--json",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert [row["nodes"] for row in document["predicted"]] == [1, 2, 512]
    assert document["predicted"][0]["ranks"] == 4
    assert [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("|")][2:] == [
        "1",
        "2",
        "512",
    ]
    missing = harness("predict", "--site", "polaris", timeout=120)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "give the compute: --record RESULTS.jsonl, or --throughput" in missing.stderr


@pytest.mark.slow
def test_bench_allreduce_on_two_local_ranks(tmp_path):
    out = tmp_path / "bench.json"
    result = harness(
        "bench",
        "allreduce",
        "-n",
        "2",
        "--backend",
        "ddp",
        "--sizes",
        "4K,256K,4M",
        "--seconds-per-size",
        "0.05",
        "--results",
        str(out),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    bench = json.loads(out.read_text())
    assert bench["world_size"] == 2 and [line["bytes"] for line in bench["sizes"]] == [4096, 262144, 4194304]
    for line in bench["sizes"]:
        assert line["busbw_bytes_per_s"] == pytest.approx(line["algbw_bytes_per_s"] * 2 * 1 / 2)
        assert line["repeats"] >= 3
    assert bench["fit"]["busbw_bytes_per_s"] > 0 and "flagged" in bench["contention"]
    assert "busbw (GB/s)" in result.stdout and result.stdout.count("busbw (GB/s)") == 1


def test_predicted_and_measured_on_the_same_axes(tmp_path):
    """`harness predict --measured`: the table's error column and the figure's points, from records."""
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        "".join(
            json.dumps(run) + "\n"
            for run in [
                _measured_run(1, 0.075),
                _measured_run(1, 0.077, 1),
                _measured_run(2, 0.1),
                _measured_run(2, 0.11, 1),
            ]
        )
    )
    bench = tmp_path / "bench.json"
    bench.write_text(
        json.dumps(
            {
                "kind": "allreduce-benchmark",
                "backend": "ddp",
                "world_size": 2,
                "nodes": 2,
                "ranks_per_node": 1,
                "hostname": "node1",
                "fit": {"alpha_s": 1e-4, "busbw_bytes_per_s": 1e8},
            }
        )
    )
    result = harness(
        "predict",
        "--network",
        str(bench),
        "--record",
        str(runs),
        "--measured",
        str(runs),
        "--nodes",
        "1,2,4",
        "-o",
        str(tmp_path / "fig"),
        "--json",
        str(tmp_path / "p.json"),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    figure = json.loads((tmp_path / "fig-prediction.json").read_text())
    assert [row["ranks"] for row in figure["predicted"]] == [1, 2, 4]
    assert set(figure["measured"]) == {"1", "2"} and (tmp_path / "fig-prediction.png").stat().st_size > 0
    table = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in result.stdout.splitlines()
        if line.startswith("|")
    ]
    assert table[0][-4:-1] == ["measured step ms", "95% interval", "error"]
    assert table[3][1] == "2" and table[3][-2].startswith(("+", "-")) and table[4][-2] == "-"  # 4 ranks: not run
