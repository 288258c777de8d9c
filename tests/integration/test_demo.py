"""`make demo` shows the harness's progress and the comparison table, not framework logging; a
failing run shows the end of its log (no rank's error is hidden)."""

from __future__ import annotations

import re

import pytest

from harness.backends import BACKENDS
from harness.training.record import read_records
from tests.conftest import harness
from tests.helpers.backend_cases import ALL, DISTRIBUTED, ranks


@pytest.mark.slow
def test_the_demo_prints_progress_and_a_table_and_keeps_framework_logging_in_logs(tmp_path):
    results = tmp_path / "demo.jsonl"
    result = harness("demo", "--epochs", "1", "--results", str(results), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    rows = [line for line in out.splitlines() if re.match(rf"^\|\s+({'|'.join(ALL)}) \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == ALL
    assert out.count("   epoch 1/1 | train loss") == len(ALL)  # rank 0's progress line of every run, once
    for backend in ALL:
        launcher = BACKENDS[backend].local_launcher
        assert f"== {backend} on {ranks(backend)} process(es) ({launcher} launcher" in out
    # Launcher prefixes and DeepSpeed's INFO logging stay in the per-run logs.
    assert "<stdout>" not in out and "[INFO]" not in out and "[WARNING]" not in out
    logs = sorted(path.name for path in (tmp_path / "demo").iterdir())  # runs/<stamp>/ beside the results
    assert logs == sorted(f"{backend}.log" for backend in ALL)
    assert "[INFO]" in (tmp_path / "demo" / "deepspeed.log").read_text()
    assert "built successfully" not in (tmp_path / "demo" / "deepspeed.log").read_text()  # no JIT compile
    # The 2-rank rows train the same model: same losses.
    losses = {row.split("|")[1].strip(): row.split("|")[8].strip() for row in rows}
    assert len({losses[backend] for backend in DISTRIBUTED}) == 1, losses
    # Every backend's record states each rank's peak memory, gathered from every rank.
    records = read_records([str(results)])
    assert sorted(record["backend"] for record in records) == sorted(ALL)
    for record in records:
        memory = record["memory"]
        assert memory["source"] == "rss_peak" and len(memory["peak_bytes_per_rank"]) == record["world_size"], record
        assert all(peak > 0 for peak in memory["peak_bytes_per_rank"]), record
