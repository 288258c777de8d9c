"""Contention: the verdict from recorded numbers, the measures from /proc, and how reports and figures
show it; same work per rank: efficiency is refused against a baseline with other threads per rank."""

from __future__ import annotations

import pytest

from harness.study.plot import CONTENTION_LABEL, breakdown_figure, efficiency_figure, throughput_figure
from harness.study.report import scaling_report, scaling_rows
from harness.training import contention
from harness.training.metrics import contention_reasons, contention_summary
from tests.helpers.handmade_records import record

# Measured by a 1-rank run of this harness on a 2-core machine shared with other jobs (load 17.5):
# the rank had its one thread on a CPU 29% of its compute time and its threads waited for a CPU
# 71% of the time they were ready to run.
BUSY = {"cpu_share": [0.289], "runqueue_wait_share": [0.711], "load_average": 17.53, "cores": 2, "steal_share": 0.0053}
QUIET = {
    "cpu_share": [0.98, 1.01],
    "runqueue_wait_share": [0.004, 0.02],
    "load_average": 2.1,
    "cores": 2,
    "steal_share": 0.0,
}


def test_a_run_on_a_busy_machine_is_flagged_with_every_reason():
    summary = contention_summary(BUSY)
    assert summary["flagged"] is True
    assert summary["reasons"] == [
        "rank 0 had the CPU 29% of its compute time x threads (< 80%)",
        "rank 0's threads waited for a CPU 71% of the time they could run (> 10%)",
        "load average 17.5 on 2 cores (> 1.25 per core)",
    ]
    assert summary["thresholds"] == {
        "cpu_share_below": 0.8,
        "runqueue_wait_above": 0.1,
        "load_per_core_above": 1.25,
        "steal_above": 0.05,
    }


def test_a_run_that_fills_its_cores_alone_is_not_flagged():
    # Two ranks on two cores: the load is about the cores, the threads hardly wait.
    assert contention_summary(QUIET) == {
        **QUIET,
        "flagged": False,
        "reasons": [],
        "thresholds": contention_summary(BUSY)["thresholds"],
    }


@pytest.mark.parametrize(
    "change, reason",
    [
        (dict(cpu_share=[0.98, 0.7]), "rank 1 had the CPU 70%"),
        (dict(runqueue_wait_share=[0.2, 0.01]), "rank 0's threads waited for a CPU 20%"),
        (dict(load_average=2.6), "load average 2.6 on 2 cores"),
        (dict(steal_share=0.08), "8% of the CPU time was stolen"),
    ],
)
def test_each_threshold_alone_flags_a_run(change, reason):
    reasons = contention_reasons(
        **{
            **{
                "cpu_share": QUIET["cpu_share"],
                "runqueue_wait": QUIET["runqueue_wait_share"],
                "load_average": QUIET["load_average"],
                "cores": 2,
                "steal": QUIET["steal_share"],
            },
            **{
                ("runqueue_wait" if k == "runqueue_wait_share" else "steal" if k == "steal_share" else k): v
                for k, v in change.items()
            },
        }
    )
    assert len(reasons) == 1 and reasons[0].startswith(reason)


def test_what_a_machine_does_not_measure_flags_nothing():
    assert contention_reasons([None], [None], None, 2, None) == []


def test_cpu_meter_reads_schedstat_and_proc_stat(tmp_path, monkeypatch):
    """The meter's arithmetic on recorded /proc contents: two threads, one that ends mid-window."""
    tasks = tmp_path / "task"
    for tid in ("10", "11"):
        (tasks / tid).mkdir(parents=True)
    stat = tmp_path / "stat"
    monkeypatch.setattr(contention, "TASKS_DIR", str(tasks))
    monkeypatch.setattr(contention, "PROC_STAT", str(stat))

    def write(schedstats, steal, total_rest):
        for tid, (running, waiting) in schedstats.items():
            (tasks / tid / "schedstat").write_text(f"{running} {waiting} 7\n")
        stat.write_text(f"cpu  {total_rest} 0 0 0 0 0 0 {steal} 0 0\ncpu0 1 2 3\n")

    meter = contention.CpuMeter(threads=2)
    write({"10": (1_000, 500), "11": (2_000, 0)}, steal=10, total_rest=990)
    meter.open()
    (tasks / "11" / "schedstat").unlink()  # thread 11 ends in the window: left out, never negative
    (tasks / "12").mkdir()  # thread 12 starts in the window: counted from zero
    write({"10": (4_000, 1_500), "12": (3_000, 1_000)}, steal=30, total_rest=1_170)
    meter.close()
    assert meter.runqueue_wait_share() == pytest.approx((1_000 + 1_000) / (3_000 + 3_000 + 2_000))
    assert meter.steal_share() == pytest.approx(20 / 200)
    assert meter.cpu_share() is None  # no compute phase was added
    assert meter.values()[0] == -1.0 and meter.values()[1] == pytest.approx(0.25)


def _study(contended_baseline: bool = False, threads_two: int = 1):
    return [
        record("ddp", 1, 500.0, contended=contended_baseline),
        record("ddp", 1, 520.0, repeat=1, contended=contended_baseline),
        record("ddp", 2, 1150.0, threads=threads_two),
        record("ddp", 2, 1170.0, repeat=1, threads=threads_two),
        record("ddp", 1, 800.0, threads=2, baseline="all-cores"),
        record("ddp", 1, 810.0, threads=2, baseline="all-cores", repeat=1),
    ]


def test_weak_efficiency_above_one_is_suspect_and_blamed_on_the_contended_baseline():
    rows = {(row.workers, row.baseline): row for row in scaling_rows(_study(contended_baseline=True))}
    two = rows[2, ""]
    assert two.efficiency == pytest.approx(1160 / 510 / 2) and two.efficiency > 1.05
    assert two.suspect == "its baseline ran under contention, so it is too slow"
    text = scaling_report(_study(contended_baseline=True))
    assert "? ddp x2: weak-scaling efficiency 1.14 > 1.05 is suspect: its baseline ran under contention" in text
    assert [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("|")][2:] == [
        "ddp †",
        "ddp",
        "ddp (1 rank, all cores)",
    ]
    assert "† ddp x1: 2 of 2 run(s) measured under contention: load average 9.0 on 2 cores" in text


def test_the_all_cores_run_is_its_own_row_and_never_a_baseline():
    rows = scaling_rows(_study())
    all_cores = next(row for row in rows if row.baseline)
    assert all_cores.label == "ddp (1 rank, all cores)" and all_cores.efficiency is None
    assert next(row for row in rows if row.workers == 2).baseline_workers == 1
    assert next(row for row in rows if row.workers == 2).efficiency == pytest.approx(1160 / 510 / 2)
    assert "ddp (1 rank, all cores): one rank with 2 threads, a configuration of its own" in scaling_report(_study())


def test_no_efficiency_against_a_baseline_with_other_threads_per_rank():
    rows = scaling_rows(_study(threads_two=2))  # 2 ranks x 2 threads against 1 rank x 1 thread
    two = next(row for row in rows if row.workers == 2)
    assert two.efficiency is None and two.speedup is None
    assert two.note == (
        "ddp x2: no efficiency: its baseline (1 worker(s)) ran 1 threads per rank, this run 2; "
        "sweep with one --threads"
    )
    assert two.note in scaling_report(_study(threads_two=2))


def test_figures_mark_contended_runs_and_the_all_cores_star():
    rows = scaling_rows(_study(contended_baseline=True))
    study = rows[0].study
    throughput = throughput_figure(rows, study)
    legend = [text.get_text() for text in throughput.axes[0].get_legend().get_texts()]
    assert CONTENTION_LABEL in legend and "1 rank x all cores (not a baseline)" in legend
    metadata = throughput.harness_metadata
    assert metadata["contention_marked"] is True and metadata["series"][0]["contended"] == [True, False]
    assert metadata["all_cores"] == [{"backend": "ddp", "throughput": 805.0, "threads_per_rank": 2}]
    efficiency = efficiency_figure(rows, study).harness_metadata
    assert efficiency["series"][0]["suspect"][1].startswith("its baseline ran under contention")
    bars = breakdown_figure(rows, study).harness_metadata["bars"]
    assert [(bar["workers"], bar["baseline"], bar["contended"]) for bar in bars] == [
        (1, "", True),
        (2, "", False),
        (1, "all-cores", False),
    ]
    quiet = throughput_figure(scaling_rows(_study()), study)
    assert CONTENTION_LABEL not in [text.get_text() for text in quiet.axes[0].get_legend().get_texts()]
