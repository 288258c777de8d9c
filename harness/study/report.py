"""Tables from results records (Markdown, readable in a terminal and in a notebook).

Besides the per-run table (RUN_COLUMNS), this module turns a scaling study's records into one
row per backend x worker count (`scaling_rows`), which both `harness report` and `harness plot`
use, so a table and a figure of the same file always show the same numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..training.metrics import STEP_PHASES, scaling_efficiency, speedup
from ..training.record import mean_and_ci95

Column = Tuple[str, Callable[[Dict[str, Any]], Any]]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(records: Sequence[Dict[str, Any]], columns: Sequence[Column]) -> str:
    """One row per record, one column per (header, getter)."""
    rows: List[List[str]] = [[_cell(get(record)) for _, get in columns] for record in records]
    headers = [header for header, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


RUN_COLUMNS: Sequence[Column] = (
    ("backend", lambda r: r["backend"]),
    ("ranks", lambda r: r["world_size"]),
    ("global batch", lambda r: r["global_batch"]),
    ("lr", lambda r: r["lr_effective"]),
    ("samples/s", lambda r: r["throughput"]),
    ("per worker", lambda r: r["throughput_per_worker"]),
    ("AU", lambda r: r.get("au")),
    ("train loss", lambda r: r["train_loss"]),
    ("eval loss", lambda r: r.get("eval_loss")),
    ("eval acc %", lambda r: 100 * r["eval_accuracy"] if r.get("eval_accuracy") is not None else None),
    ("eval samples", lambda r: r.get("eval_samples")),
    ("wall s", lambda r: r["wall_time"]),
)


@dataclass(frozen=True, order=True)
class Study:
    """What a scaling study holds fixed; rows of different studies are never compared."""

    scaling: str  # "weak" (batch per worker fixed) or "strong" (global batch fixed)
    model: str
    dataset: str
    batch: int  # per worker for weak scaling, global for strong scaling
    device: str

    def title(self) -> str:
        """e.g. 'Weak scaling: cnn on synthetic, 64 samples per worker (cpu)'."""
        batch = (f"{self.batch} samples per worker" if self.scaling == "weak"
                 else f"global batch {self.batch}")
        return f"{self.scaling.capitalize()} scaling: {self.model} on {self.dataset}, {batch} ({self.device})"

    def slug(self) -> str:
        """A file-name fragment, e.g. 'weak-cnn-synthetic-b64-cpu'."""
        return f"{self.scaling}-{self.model}-{self.dataset}-b{self.batch}-{self.device}"


@dataclass
class ScalingRow:
    """One backend at one worker count of a study, aggregated over its repeats."""

    study: Study
    backend: str
    workers: int
    runs: int
    throughput: float  # samples/s, mean over runs
    throughput_ci95: Optional[float]  # over runs; over the run's epochs when there is one run
    speedup: Optional[float]  # against the same backend at the study's fewest workers
    efficiency: Optional[float]
    baseline_workers: int
    au: Optional[float]
    load_balance: Optional[float]
    communication_efficiency: Optional[float]
    parallel_efficiency: Optional[float]
    seconds_per_step: Dict[str, Optional[float]]  # STEP_PHASES, mean over ranks and runs


def scaling_mode(record: Dict[str, Any]) -> str:
    """The record's sweep tag, or what its batch flags imply for a run made outside a sweep."""
    tagged = record.get("tags", {}).get("scaling")
    if tagged:
        return tagged
    return "strong" if record.get("config", {}).get("global_batch") else "weak"


def study_of(record: Dict[str, Any]) -> Study:
    """The study a record belongs to."""
    mode = scaling_mode(record)
    batch = record["local_batch"] if mode == "weak" else record["global_batch"]
    return Study(mode, record["model"], record["dataset"], batch, record.get("device", "cpu"))


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def scaling_rows(records: Sequence[Dict[str, Any]]) -> List[ScalingRow]:
    """Records grouped by study, backend and workers; backends in order of first appearance.

    Throughput is the mean over repeats with a 95% interval over repeats (over epochs for a
    single run). Speedup and efficiency are against the same backend at the study's fewest
    workers (normally 1), so each framework's own overhead at one worker is in its baseline.
    """
    groups: Dict[Tuple[Study, str, int], List[Dict[str, Any]]] = {}
    backend_order: Dict[str, int] = {}
    for record in records:
        if not record.get("throughput"):
            continue  # a run too short to have a timed window
        backend_order.setdefault(record["backend"], len(backend_order))
        groups.setdefault((study_of(record), record["backend"], record["world_size"]), []).append(record)
    rows = []
    for (study, backend, workers), runs in sorted(groups.items(), key=lambda item: (
            item[0][0], backend_order[item[0][1]], item[0][2])):
        throughputs = [run["throughput"] for run in runs]
        spread = mean_and_ci95(throughputs)
        breakdowns = [run.get("step_breakdown", {}).get("seconds_per_step", {}) for run in runs]
        rows.append(ScalingRow(
            study=study, backend=backend, workers=workers, runs=len(runs), throughput=spread["mean"],
            throughput_ci95=spread["ci95"] if len(runs) > 1 else runs[0].get("throughput_ci95"),
            speedup=None, efficiency=None, baseline_workers=workers,
            au=_mean([run.get("au") for run in runs]),
            load_balance=_mean([run.get("load_balance") for run in runs]),
            communication_efficiency=_mean([run.get("communication_efficiency") for run in runs]),
            parallel_efficiency=_mean([run.get("parallel_efficiency") for run in runs]),
            seconds_per_step={phase: _mean([b.get(phase) for b in breakdowns]) for phase in STEP_PHASES},
        ))
    baselines: Dict[Tuple[Study, str], ScalingRow] = {}
    for row in rows:  # sorted by workers within a study and backend: the first is the baseline
        base = baselines.setdefault((row.study, row.backend), row)
        row.baseline_workers = base.workers
        row.speedup = speedup(row.throughput, base.throughput)
        row.efficiency = scaling_efficiency(row.throughput, row.workers, base.throughput, base.workers)
    return rows


def _with_interval(mean: Optional[float], ci95: Optional[float]) -> str:
    return f"{_cell(mean)} ± {_cell(ci95)}"


SCALING_COLUMNS: Sequence[Column] = (
    ("backend", lambda r: r["backend"]),
    ("workers", lambda r: r["workers"]),
    ("runs", lambda r: r["runs"]),
    ("samples/s ± 95%", lambda r: _with_interval(r["throughput"], r["throughput_ci95"])),
    ("speedup", lambda r: r["speedup"]),
    ("efficiency", lambda r: r["efficiency"]),
    ("AU", lambda r: r["au"]),
    ("load balance", lambda r: r["load_balance"]),
    ("comm. efficiency", lambda r: r["communication_efficiency"]),
    ("parallel efficiency", lambda r: r["parallel_efficiency"]),
)


def scaling_report(records: Sequence[Dict[str, Any]]) -> str:
    """Markdown: per study, a heading and one row per backend x workers (see SCALING_COLUMNS)."""
    rows = scaling_rows(records)
    if not rows:
        return "(no records with a timed window)"
    sections = []
    for study in sorted({row.study for row in rows}):
        mine = [row for row in rows if row.study == study]
        sections.append(f"### {study.title()}\n\n"
                        + markdown_table([dataclasses.asdict(row) for row in mine], SCALING_COLUMNS)
                        + "\n\nspeedup and efficiency: against the same backend at its fewest workers "
                          "(efficiency = speedup x baseline workers / workers); ± is the 95% interval over "
                          "runs, or over epochs for a single run (- when neither has two values); AU and "
                          "POP metrics (load balance x communication efficiency = parallel efficiency) are "
                          "means over runs.")
    return "\n\n".join(sections)
