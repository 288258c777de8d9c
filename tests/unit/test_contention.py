"""Contention: the verdict from recorded numbers, the measures from /proc, and how reports and figures
show it; same work per rank: efficiency is refused against a baseline with other threads per rank."""

from __future__ import annotations

import pytest

from harness.study.scaling.plot import CONTENTION_LABEL, breakdown_figure, efficiency_figure, throughput_figure
from harness.study.scaling.report import scaling_report, scaling_rows
from harness.training import contention
from harness.training.metrics import contention_reasons, contention_summary
from tests.helpers.handmade_records import contention_measures, record


def test_a_run_beside_other_processes_is_flagged_with_the_share_they_took():
    summary = contention_summary(contention_measures(2, 0.72), "1 compute thread(s)")
    assert summary["flagged"] is True
    assert summary["outside_cpu_share"] == pytest.approx(0.72)
    assert summary["reasons"] == ["other processes used 72% of the CPU time of the job's cores (> 10%)"]
    assert summary["thresholds"] == {"outside_load_above": 0.1, "steal_above": 0.05, "throttled_above": 0.05}


def test_the_jobs_own_oversubscription_is_said_in_words_and_never_flags():
    """2 ranks x (1 compute + 1 communication thread) on 2 cores, its ranks waiting for a CPU 20% of
    the time (the measure that once flagged every 2-rank run): not contended."""
    words = "1 compute thread(s) + 1 communication thread (the process group's)"
    measures = contention_measures(2, 0.02, demand_per_rank=[2.0, 2.0], runqueue_wait_share=[0.18, 0.21])
    summary = contention_summary(measures, words)
    assert summary["flagged"] is False and summary["reasons"] == []
    assert summary["oversubscription"] == (
        f"2 rank(s) x ({words}) = 4 threads on 2 usable core(s): the configuration oversubscribes its cores 2.0x, "
        "so its own threads wait for one another (a property of the configuration, not contention)"
    )
    assert summary["own_evidence"]["runqueue_wait_share"] == [0.18, 0.21]
    fits = contention_summary(contention_measures(2, 0.02), "1 compute thread(s)")["oversubscription"]
    assert fits.endswith("= 2 threads on 2 usable core(s): the configuration fits its cores")


def test_ranks_on_two_nodes_are_judged_per_node_and_ranks_on_their_own_cores_add_up():
    # Rank 0 alone on node A; ranks 1 and 2 on node B, each pinned to its own core (other CPU sets).
    measures = contention_measures(
        3,
        0.0,
        node_key=[1.0, 2.0, 2.0],
        cpus_key=[1.0, 3.0, 4.0],
        cpu_seconds=[20.0, 10.0, 10.0],
        busy_seconds=[1.0, 1.0, 6.0],  # node B: 7 s busy, 2 s its ranks' own: 5 s others' of 20 s
        usable_cores=[2.0, 1.0, 1.0],
    )
    summary = contention_summary(measures)
    assert [node["outside_cpu_share"] for node in summary["nodes"]] == pytest.approx([0.0, 0.25])
    assert summary["outside_cpu_share"] == pytest.approx(0.25) and summary["flagged"]
    assert summary["nodes"][1]["usable_cores"] == 2.0


@pytest.mark.parametrize(
    "outside, steal, throttled, reason",
    [
        (0.11, None, None, "other processes used 11%"),
        (None, 0.08, None, "8% of the CPU time was stolen"),
        (0.05, 0.0, 0.06, "the job's cgroup was throttled 6%"),
    ],
)
def test_each_threshold_alone_flags_a_run(outside, steal, throttled, reason):
    reasons = contention_reasons(outside, steal, throttled)
    assert len(reasons) == 1 and reasons[0].startswith(reason)


def test_a_window_shorter_than_procs_ticks_can_resolve_is_not_judged():
    """Two timed steps of a tiny run (notebook 06's): 0.1 s on 2 cores, where one 10 ms tick of
    another process is already 5% of the cores' time. The share is not measured, and says why."""
    ticks = 1 / contention.CLOCK_TICKS
    short = contention_measures(1, 0.0, cpu_seconds=[0.2], window_seconds=[0.1], busy_seconds=[1.0 + 4 * ticks])
    summary = contention_summary(short)
    assert summary["outside_cpu_share"] is None and summary["flagged"] is False
    assert "ticks leave the outside share uncertain by 30%" in summary["nodes"][0]["outside_unmeasured"]
    # From about 0.6 s on 2 cores for one rank (1.2 CPU seconds), load is judged.
    long = contention_measures(1, 0.0, cpu_seconds=[1.5], window_seconds=[0.75], busy_seconds=[1.0 + 30 * ticks])
    judged = contention_summary(long)
    assert judged["outside_cpu_share"] == pytest.approx(0.2) and judged["flagged"]
    assert judged["nodes"][0]["outside_unmeasured"] is None


def test_what_a_machine_does_not_measure_flags_nothing():
    assert contention_reasons(None, None, None) == []
    unmeasured = contention_summary({name: [None] for name in contention.CpuMeter.FIELDS})
    assert unmeasured["flagged"] is False and unmeasured["outside_cpu_share"] is None


def test_cpu_meter_reads_its_own_cores_from_proc(tmp_path, monkeypatch):
    """The meter's arithmetic on recorded /proc contents: per-CPU lines of the allowed CPUs only,
    schedstat of two threads, one that ends mid-window."""
    tasks, stat, pressure = tmp_path / "task", tmp_path / "stat", tmp_path / "pressure"
    for tid in ("10", "11"):
        (tasks / tid).mkdir(parents=True)
    monkeypatch.setattr(contention, "TASKS_DIR", str(tasks))
    monkeypatch.setattr(contention, "PROC_STAT", str(stat))
    monkeypatch.setattr(contention, "PRESSURE_CPU", str(pressure))
    monkeypatch.setattr(contention, "CLOCK_TICKS", 100)
    monkeypatch.setattr(contention, "usable_cpus", lambda: [1])
    own = iter([5.0, 6.5])
    monkeypatch.setattr(contention, "own_seconds", lambda: next(own))

    def write(schedstats, user, idle, steal, stall_us):
        for tid, (running, waiting) in schedstats.items():
            (tasks / tid / "schedstat").write_text(f"{running} {waiting} 7\n")
        stat.write_text(
            f"cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 500 0 0 0 0 0 0 0 0 0\ncpu1 {user} 0 10 {idle} 0 5 5 {steal} 0 0\n"
        )
        pressure.write_text(f"some avg10=1.00 avg60=1.00 avg300=1.00 total={stall_us}\nfull total=0\n")

    meter = contention.CpuMeter(threads=2, demand=(3, "2 compute thread(s) + 1 helper"))
    write({"10": (1_000, 500), "11": (2_000, 0)}, user=100, idle=100, steal=0, stall_us=1_000_000)
    meter.open()
    (tasks / "11" / "schedstat").unlink()  # thread 11 ends in the window: left out, never negative
    (tasks / "12").mkdir()  # thread 12 starts in the window: counted from zero
    write({"10": (4_000, 1_500), "12": (3_000, 1_000)}, user=250, idle=130, steal=10, stall_us=1_500_000)
    meter.close()
    values = dict(zip(contention.CpuMeter.FIELDS, meter.values()))
    assert meter.runqueue_wait_share() == pytest.approx((1_000 + 1_000) / (3_000 + 3_000 + 2_000))
    assert values["busy_seconds"] == pytest.approx(1.5)  # cpu1's user time only; cpu0 is not ours
    assert values["cpu_seconds"] == pytest.approx(1.9) and values["steal_seconds"] == pytest.approx(0.1)
    assert values["own_seconds"] == pytest.approx(1.5) and values["pressure_seconds"] == pytest.approx(0.5)
    assert values["cpus"] == 1 and values["demand_per_rank"] == 3
    assert values["cpu_share"] == -1.0  # no compute phase was added


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
    assert "† ddp x1: 2 of 2 run(s) measured under contention: other processes used 75% of the CPU time" in text


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
