"""harness.workshop.packing (notebook 05): the placements cover the cores without oversubscribing them, MPS is
started and stopped cleanly where it can be and refused with a reason where it cannot, and a
packing study's records carry their placement.

No GPU here: the MPS control program is emulated by a script that behaves like
`nvidia-cuda-mps-control` (`-d` starts a daemon, "quit" on stdin stops it)."""

from __future__ import annotations

import os
import stat

import pytest

from harness.errors import UsageError
from harness.process.phases import STEP_COLUMNS
from harness.workshop.packing import (
    MPS_VARIABLES,
    mps_daemon,
    packing_rows,
    packing_table,
    packings,
    run_packing_study,
)


@pytest.mark.parametrize(
    "cores,max_ranks,expected",
    [
        (2, 8, [(1, 2), (2, 1)]),
        (16, 8, [(1, 16), (2, 8), (4, 4), (8, 2)]),
        (6, 8, [(1, 6), (2, 3), (4, 1)]),
        (1, 8, [(1, 1)]),
    ],
)
def test_cpu_packings_share_the_cores_without_oversubscribing(cores, max_ranks, expected):
    plan = packings(cores=cores, gpus=0, max_ranks=max_ranks)
    assert [(p.ranks, p.threads) for p in plan] == expected
    assert all(p.ranks * p.threads <= cores and p.device == "cpu" and p.ranks_per_device == p.ranks for p in plan)
    assert plan[0].train_args() == ["--threads", str(cores), "--pin-cores", "--tag", "ranks_per_device=1"]


def test_gpu_packings_put_one_two_and_four_ranks_on_every_gpu():
    plan = packings(cores=32, gpus=4)
    assert [(p.ranks, p.ranks_per_device, p.threads) for p in plan] == [(4, 1, 8), (8, 2, 4), (16, 4, 2)]
    assert plan[1].train_args() == ["--procs-per-gpu", "2", "--tag", "ranks_per_device=2"]
    assert plan[2].label() == "4 rank(s) per GPU (16 ranks)"


def test_mps_is_refused_with_a_reason_without_a_gpu():
    with mps_daemon(0) as state:
        assert not state.running and "no GPU" in state.reason
        assert not os.environ.get(MPS_VARIABLES[0])


def test_mps_is_refused_with_a_reason_when_the_control_program_is_missing(monkeypatch, tmp_path):
    monkeypatch.delenv(MPS_VARIABLES[0], raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with mps_daemon(1) as state:
        assert not state.running and "not installed" in state.reason


def _fake_control(tmp_path, start_status: int) -> str:
    """A stand-in for nvidia-cuda-mps-control that logs its calls and its pipe directory."""
    script = tmp_path / "nvidia-cuda-mps-control"
    log = tmp_path / "calls.log"
    script.write_text(
        "#!/usr/bin/env bash\nset -euo pipefail\n"
        f'if [[ "${{1:-}}" == "-d" ]]; then echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "{log}"; '
        f'echo "cannot start" >&2; exit {start_status}; fi\n'
        f'read -r command; echo "$command $CUDA_MPS_PIPE_DIRECTORY" >> "{log}"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_a_daemon_the_site_runs_is_used_as_it_is(monkeypatch, tmp_path):
    monkeypatch.setenv(MPS_VARIABLES[0], "/var/run/site-mps")
    with mps_daemon(2, control=_fake_control(tmp_path, 1)) as state:
        assert state.running and "/var/run/site-mps" in state.reason
    assert not (tmp_path / "calls.log").exists()  # nothing started, nothing quit


@pytest.mark.parametrize("flags", [["--threads", "4"], ["--pin-cores"], ["--procs-per-gpu", "2"]])
def test_a_packing_study_refuses_placement_flags_in_its_train_args(tmp_path, flags):
    with pytest.raises(UsageError, match="--threads, --pin-cores and --procs-per-gpu"):
        run_packing_study(flags, str(tmp_path / "r.jsonl"), packings(cores=2, gpus=0))


def _record(world_size: int, per_device: int, throughput: float, threads: int = 0, repeat: int = 0) -> dict:
    return {
        "world_size": world_size,
        "throughput": throughput,
        "threads_per_rank": threads or 2 // world_size,
        "device": "cpu",
        "tags": {"ranks_per_device": str(per_device), "mps": "off", "packing_repeat": str(repeat)},
        "step_breakdown": {"seconds_per_step": {phase: 0.001 for phase in STEP_COLUMNS}},
    }


def test_packing_rows_average_repeats_and_compare_with_the_first_placement():
    rows = packing_rows(
        [_record(1, 1, 100.0), _record(2, 2, 300.0), _record(1, 1, 200.0, repeat=1), _record(2, 2, 300.0, repeat=1)]
    )
    assert [(row["ranks per device"], row["runs"], row["samples/s"], row["speedup"]) for row in rows] == [
        (1, 2, 150.0, 1.0),
        (2, 2, 300.0, 2.0),
    ]
    assert rows[1]["per rank"] == 150.0 and rows[1]["per step ms"]["forward_backward"] == pytest.approx(1.0)
    assert packing_table([_record(1, 1, 100.0)]).startswith("| ranks per device |")


def test_one_rank_with_one_thread_and_with_two_are_different_placements():
    rows = packing_rows([_record(1, 1, 100.0, threads=1), _record(1, 1, 150.0, threads=2), _record(2, 2, 180.0)])
    assert [row["placement"] for row in rows] == [
        "1 rank(s) x 1 thread(s)",
        "1 rank(s) x 2 thread(s)",
        "2 rank(s) x 1 thread(s)",
    ]
    assert [row["speedup"] for row in rows] == [1.0, 1.5, 1.8]


def test_packing_rows_pair_the_rounds_and_say_whether_the_speedup_interval_leaves_out_one():
    steady = [
        _record(ranks, ranks, base * ranks, repeat=r) for r, base in enumerate((100, 150, 110)) for ranks in (1, 2)
    ]
    rows = packing_rows(steady)
    assert [row["placement"] for row in rows] == ["1 rank(s) x 2 thread(s)", "2 rank(s) x 1 thread(s)"]
    # The load drifts from round to round, but each round's ratio is 2: paired, the interval is 2 exactly.
    assert rows[1]["speedup interval"] == pytest.approx((2.0, 2.0)) and rows[1]["apart"] is True
    low, high = rows[0]["interval"]
    assert low < rows[0]["samples/s"] < high and rows[0]["apart"] is None
    noisy = [
        _record(1, 1, 100.0),
        _record(2, 2, 300.0),
        _record(1, 1, 300.0, repeat=1),
        _record(2, 2, 100.0, repeat=1),
        _record(1, 1, 200.0, repeat=2),
        _record(2, 2, 200.0, repeat=2),
    ]
    assert packing_rows(noisy)[1]["apart"] is False
    assert packing_rows(noisy[:4])[1]["apart"] is None  # two rounds: too few for an interval
    table = packing_table(steady)
    assert "2.00 [2.00, 2.00]" in table and table.rstrip("| \n").endswith("yes")


def test_a_packing_study_numbers_its_runs_over_the_whole_study(monkeypatch, tmp_path, capsys):
    from harness.study.scaling import sweep

    started = []

    def fake_run_sweep(settings):
        started.append(settings.train_args)
        print("== [1/1] the sweep's own line")  # a one-run sweep numbers its run 1/1
        return sweep.SweepResult("id", [{"world_size": settings.ranks[0]}], [], False, 0)

    monkeypatch.setattr(sweep, "run_sweep", fake_run_sweep)
    study = run_packing_study(["--max-steps", "3"], str(tmp_path / "r.jsonl"), packings(cores=2, gpus=0), repeats=3)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("==")]
    assert [line.split(":")[0] for line in lines] == [
        f"== [{n}/6] {ranks} rank(s) x {3 - ranks} thread(s), repeat {(n + 1) // 2}/3"
        for n, ranks in zip(range(1, 7), [1, 2] * 3)
    ]
    assert [r["world_size"] for r in study["records"]] == [1, 2] * 3
    assert [args[args.index("--threads") + 1] for args in started] == ["2", "1"] * 3
    assert [args[-1] for args in started] == [f"packing_repeat={n // 2}" for n in range(6)]
