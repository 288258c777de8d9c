"""Results records written by hand, shaped like `harness train`'s, for arithmetic and plotting tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional


def record(
    backend: str,
    workers: int,
    throughput: float,
    *,
    scaling: str = "weak",
    local_batch: int = 64,
    useful: Optional[Sequence[float]] = None,
    runtime: float = 1.0,
    au: float = 0.95,
    repeat: int = 0,
    model: str = "cnn",
    dataset: str = "synthetic",
    threads: Optional[int] = 1,
    contended: bool = False,
    baseline: str = "",
    options: Optional[dict[str, Any]] = None,
    state_mib: Optional[Sequence[float]] = None,
) -> dict[str, Any]:
    """One run's record; POP metrics follow from `useful` (per-rank seconds) and `runtime`;
    `contended` gives it a contention section flagged by other processes using 75% of its cores; `options`
    are its backend options; `state_mib` its model state per rank, in MiB (peaks 700 MiB more)."""
    from harness.training.metrics import contention_summary, pop_metrics

    useful = list(useful) if useful is not None else [0.8 * runtime] * workers
    steps = 10
    global_batch = local_batch * workers
    return {
        "backend": backend,
        "world_size": workers,
        "local_batch": local_batch,
        "global_batch": global_batch,
        "model": model,
        "dataset": dataset,
        "device": "cpu",
        "throughput": throughput,
        "throughput_ci95": None,
        "au": au,
        **pop_metrics(useful, runtime),
        "config": {"global_batch": global_batch if scaling == "strong" else None, "backend_options": options or {}},
        "memory": {
            "peak_bytes_per_rank": [int((700 + mib) * 2**20) for mib in state_mib or [0] * workers],
            "model_state_bytes_per_rank": {"total": [int(mib * 2**20) for mib in state_mib]} if state_mib else None,
        },
        "tags": {
            "scaling": scaling,
            "repeat": str(repeat),
            "sweep_id": "handmade",
            **({"baseline": baseline} if baseline else {}),
        },
        "threads_per_rank": threads,
        "contention": contention_summary(contention_measures(workers, 0.75 if contended else 0.025)),
        "step_breakdown": {
            "seconds_per_step": {
                "data_wait": 0.05 * runtime / steps,
                "forward_backward": 0.6 * runtime / steps,
                "communication": 0.2 * runtime / steps,
                "optimizer": 0.1 * runtime / steps,
                "other": 0.05 * runtime / steps,
                "runtime": runtime / steps,
                "useful": 0.7 * runtime / steps,
            }
        },
    }


def weak_study() -> list:
    """Three backends at 1 and 2 workers (ddp with two repeats at 2 workers), plus `none` at 1."""
    return [
        record("none", 1, 1000.0),
        record("ddp", 1, 950.0),
        record("ddp", 2, 1710.0, useful=[0.8, 0.8]),
        record("ddp", 2, 1690.0, useful=[0.8, 0.8], repeat=1),
        record("horovod", 1, 900.0),
        record("horovod", 2, 1440.0, useful=[0.6, 0.8]),
        record("deepspeed", 1, 800.0),
        record("deepspeed", 2, 1200.0, useful=[0.4, 0.8]),
    ]


def contention_measures(workers: int, outside_share: float, **changes: list) -> dict[str, list]:
    """Every rank's CpuMeter measures on one node of 2 cores over a 10 s window, where processes
    that are not the job's used `outside_share` of the cores' time; `changes` replace fields."""
    from harness.training.contention import CpuMeter

    measures: dict[str, list] = {name: [None] * workers for name in CpuMeter.FIELDS}
    own = 1.0  # CPU seconds of each rank
    measures.update(
        cpu_share=[0.95] * workers,
        runqueue_wait_share=[0.01] * workers,
        load_average=[1.0] * workers,
        busy_seconds=[own * workers + outside_share * 20.0] * workers,
        steal_seconds=[0.0] * workers,
        cpu_seconds=[20.0] * workers,
        own_seconds=[own] * workers,
        window_seconds=[10.0] * workers,
        throttled_seconds=[0.0] * workers,
        cpus=[2.0] * workers,
        usable_cores=[2.0] * workers,
        cpus_key=[1.0] * workers,
        node_key=[1.0] * workers,
        demand_per_rank=[1.0] * workers,
    )
    measures.update(changes)
    return measures
