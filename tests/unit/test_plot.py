"""`harness plot`: figures from hand-made records, checked on the figure objects and their metadata."""

from __future__ import annotations

import json

import pytest

from harness.errors import UsageError
from harness.study.scaling.plot import breakdown_figure, efficiency_figure, throughput_figure, write_figures
from harness.study.scaling.report import scaling_rows
from tests.helpers.handmade_records import record, weak_study

# The hand-made study's backends, in the order of their first record: the order of every figure's series.
BACKENDS = list(dict.fromkeys(run["backend"] for run in weak_study()))


def _study_rows():
    rows = scaling_rows(weak_study())
    return rows, rows[0].study


def test_throughput_figure_has_one_series_per_backend_and_ideal_lines():
    rows, study = _study_rows()
    fig = throughput_figure(rows, study)
    ax = fig.axes[0]
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert legend == [*BACKENDS, "ideal (linear from fewest workers)"]
    assert [s["backend"] for s in fig.harness_metadata["series"]] == BACKENDS
    ddp = next(s for s in fig.harness_metadata["series"] if s["backend"] == "ddp")
    assert ddp["workers"] == [1, 2] and ddp["values"] == pytest.approx([950.0, 1700.0])
    ideal = next(i for i in fig.harness_metadata["ideal"] if i["backend"] == "ddp")
    assert ideal["values"] == pytest.approx([950.0, 1900.0])
    assert ax.get_xlabel() == "workers (processes)" and ax.get_ylabel() == "throughput (samples/s)"
    assert "Weak scaling: cnn on synthetic, 64 samples per worker" in ax.get_title()


def test_efficiency_and_breakdown_figures():
    rows, study = _study_rows()
    efficiency = efficiency_figure(rows, study)
    assert [s["backend"] for s in efficiency.harness_metadata["series"]] == BACKENDS
    horovod = next(s for s in efficiency.harness_metadata["series"] if s["backend"] == "horovod")
    assert horovod["values"] == pytest.approx([1.0, 0.8])
    assert "speedup / workers" in efficiency.axes[0].get_ylabel()
    breakdown = breakdown_figure(rows, study)
    assert [(b["backend"], b["workers"]) for b in breakdown.harness_metadata["bars"]] == [
        ("none", 1),
        ("ddp", 1),
        ("ddp", 2),
        ("horovod", 1),
        ("horovod", 2),
        ("deepspeed", 1),
        ("deepspeed", 2),
    ]
    stacks = {s["phase"]: s["values_ms"] for s in breakdown.harness_metadata["stacks"]}
    assert stacks["communication"][0] == pytest.approx(20.0)  # 0.2 x 1 s runtime / 10 steps, in ms
    assert "ms" in breakdown.axes[0].get_ylabel()


def test_write_figures_writes_png_svg_and_metadata(tmp_path):
    written = write_figures(weak_study(), str(tmp_path / "weak"))
    for kind in ("throughput", "efficiency", "breakdown"):
        for ext in ("png", "svg", "json"):
            path = tmp_path / f"weak-{kind}.{ext}"
            assert str(path) in written and path.stat().st_size > 0
    assert (tmp_path / "weak-throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "weak-efficiency.svg").read_text()
    metadata = json.loads((tmp_path / "weak-throughput.json").read_text())
    assert [s["backend"] for s in metadata["series"]] == BACKENDS
    assert metadata["files"] == [str(tmp_path / "weak-throughput.png"), str(tmp_path / "weak-throughput.svg")]
    assert not list(tmp_path.glob("*.tmp"))


def test_each_study_gets_its_own_figures(tmp_path):
    records = weak_study() + [
        record("ddp", 1, 900.0, scaling="strong", local_batch=128),
        record("ddp", 2, 1600.0, scaling="strong", local_batch=64),
    ]
    write_figures(records, str(tmp_path / "all"))
    strong = json.loads((tmp_path / "all-strong-cnn-synthetic-b128-cpu-throughput.json").read_text())
    assert strong["title"].startswith("Throughput vs workers\nStrong scaling: cnn on synthetic, global batch 128")
    assert [s["backend"] for s in strong["series"]] == ["ddp"]
    assert (tmp_path / "all-weak-cnn-synthetic-b64-cpu-breakdown.svg").exists()


def test_nothing_to_plot_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="no records with a timed window"):
        write_figures([], str(tmp_path / "x"))


def test_a_job_directory_reads_as_its_results_file_and_nothing_else(tmp_path):
    """Notebook 03 and `harness report/plot` take a job template's directory: its results.jsonl, not
    the discovery-<job>.jsonl beside it."""
    import harness

    job = tmp_path / "polaris-1234"
    job.mkdir()
    runs = weak_study()
    (job / "results.jsonl").write_text("".join(json.dumps(run) + "\n" for run in runs))
    (job / "discovery-1234.jsonl").write_text(json.dumps({"rank": 0, "world_size": 2}) + "\n")
    assert harness.read_results(str(job)) == runs
    with pytest.raises(UsageError, match="results.jsonl does not exist"):
        harness.read_results(str(tmp_path))
