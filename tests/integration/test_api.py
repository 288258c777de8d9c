"""The Python API's sweep: real runs, each in a process of its own."""

from __future__ import annotations


def test_sweep_report_and_figures_from_python(tmp_path):
    import harness

    settings = harness.SweepSettings(
        backends=["none"],
        ranks=[1],
        scaling="weak",
        results=str(tmp_path / "r.jsonl"),
        train_args=[
            "--max-steps",
            "8",
            "--threads",
            "1",
            "--calibration-steps",
            "3",
            "--trace-steps",
            "2",
            "--eval-every",
            "0",
        ],
        repeats=2,
        sweep_id="py",
    )
    result = harness.run_sweep(settings)
    assert result.status == 0 and len(result.records) == 2 and not result.failed
    assert " none | " in harness.scaling_report(result.records).replace(" † |", " |")  # † marks a busy machine
    figures = harness.scaling_figures(result.records)
    assert set(figures) == {"throughput", "efficiency", "breakdown"}
    assert all(type(figure).__name__ == "Figure" for figure in figures.values())
    from harness.study.scaling.run_plots import timeline_figure

    timeline = result.records[0]["timeline"]
    assert len(timeline["per_rank"]) == 1 and len(timeline["per_rank"][0]) == 2
    for data_wait, compute, communication, optimizer in timeline["per_rank"][0]:  # consecutive phases of a step
        assert data_wait[0] <= data_wait[1] == compute[0] <= compute[1] == communication[0] <= communication[1]
        assert communication[1] == optimizer[0] <= optimizer[1]
    assert type(timeline_figure(result.records[0])).__name__ == "Figure"
    rerun = harness.run_sweep(settings)  # the same sweep id: both runs are recorded, nothing is run again
    assert rerun.status == 0 and len(rerun.records) == 2
