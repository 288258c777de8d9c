"""Tables from results records (Markdown, readable in a terminal and in a notebook).

Besides the per-run table (RUN_COLUMNS), this module turns a scaling study's records into one
row per backend x worker count (`scaling_rows`), which both `harness report` and `harness plot`
use, so a table and a figure of the same file always show the same numbers. A study is one task
(its spec and arguments, where the records name them), scaling mode, batch and device: records of
different tasks never pool into one row, and each study's footnotes name its task and the sha256
of its source. A row's efficiency is computed only against a baseline that did the same work per
rank (threads per rank); runs measured under contention are marked, and a weak-scaling efficiency
above 1.05 is marked suspect with its likely cause. Each row is set against its own fewest-worker
run and against the study's common baseline, the fastest single-process run of the same work per
rank; speedup and efficiency carry 95% intervals paired by interleave round
(harness.study.scaling.intervals: none below its MIN_ROUNDS), and configurations whose intervals overlap are
said to be not resolved rather than ranked. Under each table: one line per caveat that applies to
its study; the definitions (harness.training.metrics's own) only with `explain`, else a link to
docs/concepts/measurement.md, which says the same words.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...backends import BACKENDS
from ...errors import UsageError
from ...process.phases import STEP_COLUMNS
from ...training.metrics import (
    computation_scalability,
    global_efficiency,
    scaling_efficiency,
    speedup,
    suspect_weak_efficiency,
)
from . import intervals
from .intervals import Interval
from .report_notes import CONTENDED, GLOSSARY, SUSPECT, caveat_lines, cell, common_baseline, explanation
from .task_spec import record_task, short_digest

Column = tuple[str, Callable[[dict[str, Any]], Any]]
MIB = 2**20
ALL_CORES = "all-cores"  # the `baseline` tag of one rank with every core (harness.study.scaling.sweep)


def markdown_table(records: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """One row per record, one column per (header, getter)."""
    rows: list[list[str]] = [[cell(get(record)) for _, get in columns] for record in records]
    headers = [header for header, _ in columns]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += ["| " + " | ".join(c.rjust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def configuration(record: dict[str, Any]) -> str:
    """The record's backend and the options it ran with that are not the backend's defaults, e.g.
    'deepspeed zero_stage=2': runs of one backend with other options are other configurations."""
    options = record.get("config", {}).get("backend_options") or {}
    known = BACKENDS.get(record["backend"])
    try:
        changed = known.Options.parse(record["backend"], options).changed() if known is not None else options
    except UsageError:  # written by a version with other options: all of them, as recorded
        changed = options
    return " ".join([record["backend"], *(f"{name}={value}" for name, value in sorted(changed.items()))])


def model_state_mib(record: dict[str, Any]) -> Optional[float]:
    """The largest model state of any rank in MiB (memory.model_state_bytes_per_rank's total), if counted."""
    state = record.get("memory", {}).get("model_state_bytes_per_rank")
    return max(state["total"]) / MIB if state else None


def peak_mib(record: dict[str, Any]) -> Optional[float]:
    """The highest peak memory of any rank over the timed window, in MiB."""
    peaks = record.get("memory", {}).get("peak_bytes_per_rank")
    return max(peaks) / MIB if peaks else None


RUN_COLUMNS: Sequence[Column] = (
    ("backend", configuration),
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
    ("state MiB/rank", model_state_mib),
    ("peak MiB/rank", peak_mib),
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
    task: str = ""  # the task's spec and arguments (harness.study.scaling.task_spec.record_task); "" before tasks
    task_label: str = ""  # how a title names a task of one's own, e.g. 'tasks.py:regression width=64'

    def title(self) -> str:
        """e.g. 'Weak scaling: cnn on synthetic, 64 samples per worker (cpu)'; a task of one's own
        named after the model, e.g. '... mlp on points (tasks.py:regression width=64), ...'."""
        batch = f"{self.batch} samples per worker" if self.scaling == "weak" else f"global batch {self.batch}"
        task = f" ({self.task_label})" if self.task_label else ""
        return f"{self.scaling.capitalize()} scaling: {self.model} on {self.dataset}{task}, {batch} ({self.device})"

    def slug(self) -> str:
        """A file-name fragment, e.g. 'weak-cnn-synthetic-b64-cpu' (with six hex digits of the task's
        spec and arguments where the records name them: 'weak-cnn-synthetic-3fa2c1-b64-cpu')."""
        task = f"-{short_digest(self.task)}" if self.task else ""
        name = f"{self.scaling}-{self.model}-{self.dataset}{task}-b{self.batch}-{self.device}"
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


@dataclass
class ScalingRow:
    """One backend at one worker count of a study (and threads per rank), aggregated over its repeats."""

    study: Study
    backend: str  # with its options that are not the defaults (`configuration`), e.g. 'deepspeed zero_stage=2'
    workers: int
    runs: int
    throughput: float  # samples/s, mean over runs
    throughput_interval: Optional[Interval]  # 95%, over runs (None below intervals.MIN_ROUNDS runs)
    speedup: Optional[float]  # against the same backend at the study's fewest workers, same threads per rank
    efficiency: Optional[float]
    baseline_workers: int
    au: Optional[float]
    load_balance: Optional[float]
    communication_efficiency: Optional[float]
    parallel_efficiency: Optional[float]
    seconds_per_step: dict[str, Optional[float]]  # STEP_COLUMNS, mean over ranks and runs
    rounds: dict[str, float] = field(default_factory=dict)  # interleave round -> throughput (mean of its runs)
    useful_per_step: Optional[float] = None  # one rank's useful seconds per step, mean over ranks and runs
    transfer_efficiency_bound: Optional[float] = None
    serialisation_efficiency_bound: Optional[float] = None
    speedup_interval: Optional[Interval] = None
    efficiency_interval: Optional[Interval] = None
    computation_scalability: Optional[float] = None
    global_efficiency: Optional[float] = None
    common_efficiency: Optional[float] = None  # against the study's common baseline (`common_baseline`)
    common_efficiency_interval: Optional[Interval] = None
    is_common_baseline: bool = False  # the row is its own common baseline: exactly 1
    model_state_mib: Optional[float] = None  # the largest rank's model state, mean over runs
    peak_mib: Optional[float] = None  # the largest rank's peak memory, mean over runs
    threads_per_rank: Optional[int] = None  # None on GPUs (or records that do not say)
    baseline: str = ""  # ALL_CORES: one rank with every core, a separate configuration
    contended_runs: int = 0
    contention: list[str] = field(default_factory=list)  # why, from the first contended run
    suspect: Optional[str] = None  # why a weak-scaling efficiency above 1.05 is suspect
    note: Optional[str] = None  # why there is no efficiency

    @property
    def label(self) -> str:
        return f"{self.backend} (1 rank, all cores)" if self.baseline else self.backend


def scaling_mode(record: dict[str, Any]) -> str:
    """The record's sweep tag, or what its batch flags imply for a run made outside a sweep."""
    tagged = record.get("tags", {}).get("scaling")
    if tagged:
        return tagged
    return "strong" if record.get("config", {}).get("global_batch") else "weak"


def study_of(record: dict[str, Any]) -> Study:
    """The study a record belongs to."""
    mode = scaling_mode(record)
    batch = record["local_batch"] if mode == "weak" else record["global_batch"]
    task = record_task(record)
    return Study(mode, record["model"], record["dataset"], batch, record.get("device", "cpu"), task.key, task.label)


def _mean(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


GroupKey = tuple[Study, str, int, Optional[int], str]


def _aggregate(key: GroupKey, runs: list[dict[str, Any]]) -> ScalingRow:
    study, backend, workers, threads, baseline = key
    throughputs = [run["throughput"] for run in runs]
    by_round: dict[str, list[float]] = {}
    for run in runs:  # a run outside a sweep has no round: it pairs with nothing (no ratio interval)
        by_round.setdefault(str(run.get("tags", {}).get("repeat", f"untagged {id(run)}")), []).append(
            run["throughput"]
        )
    breakdowns = [run.get("step_breakdown", {}).get("seconds_per_step", {}) for run in runs]
    contended = [run["contention"] for run in runs if run.get("contention", {}).get("flagged")]
    return ScalingRow(
        study=study,
        backend=backend,
        workers=workers,
        runs=len(runs),
        throughput=sum(throughputs) / len(throughputs),
        throughput_interval=intervals.mean_interval(throughputs),
        speedup=None,
        efficiency=None,
        baseline_workers=workers,
        au=_mean([run.get("au") for run in runs]),
        load_balance=_mean([run.get("load_balance") for run in runs]),
        communication_efficiency=_mean([run.get("communication_efficiency") for run in runs]),
        parallel_efficiency=_mean([run.get("parallel_efficiency") for run in runs]),
        seconds_per_step={phase: _mean([b.get(phase) for b in breakdowns]) for phase in STEP_COLUMNS},
        rounds={key: sum(values) / len(values) for key, values in by_round.items()},
        useful_per_step=_mean([b.get("useful") for b in breakdowns]),
        transfer_efficiency_bound=_mean([run.get("transfer_efficiency_bound") for run in runs]),
        serialisation_efficiency_bound=_mean([run.get("serialisation_efficiency_bound") for run in runs]),
        model_state_mib=_mean([model_state_mib(run) for run in runs]),
        peak_mib=_mean([peak_mib(run) for run in runs]),
        threads_per_rank=threads,
        baseline=baseline,
        contended_runs=len(contended),
        contention=list(contended[0].get("reasons", [])) if contended else [],
    )


def scaling_rows(records: Sequence[dict[str, Any]]) -> list[ScalingRow]:
    """Records grouped by study, configuration (backend and options), workers and threads per rank;
    configurations in order of first appearance, each one's all-cores run after its scaling rows.

    Throughput is the mean over repeats with a 95% interval over repeats (none for one run).
    Speedup and efficiency are against the same backend at the study's fewest workers with the same
    threads per rank (normally 1 worker), so each framework's own overhead at one worker is in its
    baseline and every rank of the baseline did what each rank of the larger run did.
    """
    groups: dict[GroupKey, list[dict[str, Any]]] = {}
    backend_order: dict[str, int] = {}
    for record in records:
        if not record.get("throughput"):
            continue  # a run too short to have a timed window
        label = configuration(record)
        backend_order.setdefault(label, len(backend_order))
        key = (
            study_of(record),
            label,
            record["world_size"],
            record.get("threads_per_rank"),
            ALL_CORES if record.get("tags", {}).get("baseline") == ALL_CORES else "",
        )
        groups.setdefault(key, []).append(record)
    ordered = sorted(
        groups.items(),
        key=lambda item: (item[0][0], backend_order[item[0][1]], item[0][4], item[0][2], item[0][3] or 0),
    )
    rows = [_aggregate(key, runs) for key, runs in ordered]
    for row in rows:
        _compare_with_baseline(row, rows)
        common = common_baseline(row, rows)
        if common is not None and not row.baseline:
            scale = common.workers / row.workers
            row.common_efficiency = scaling_efficiency(row.throughput, row.workers, common.throughput, common.workers)
            row.is_common_baseline = row is common
            # Against itself exactly 1, whatever the rounds: the baseline resolves from the others.
            row.common_efficiency_interval = (
                (1.0, 1.0) if row is common else intervals.ratio_interval(row.rounds, common.rounds, scale)
            )
    return rows


def _compare_with_baseline(row: ScalingRow, rows: Sequence[ScalingRow]) -> None:
    """Set the row's speedup and efficiency against its baseline, or say why there is none."""
    if row.baseline:
        row.note = (
            f"{row.label}: one rank with {row.threads_per_rank or 'all'} threads, a configuration of its "
            "own; never a scaling baseline (other work per rank)"
        )
        return
    peers = [other for other in rows if (other.study, other.backend, other.baseline) == (row.study, row.backend, "")]
    fewest = min(other.workers for other in peers)
    base = next(
        (other for other in peers if other.workers == fewest and other.threads_per_rank == row.threads_per_rank), None
    )
    if base is None:
        others = sorted({str(other.threads_per_rank) for other in peers if other.workers == fewest})
        row.note = (
            f"{row.backend} x{row.workers}: no efficiency: its baseline ({fewest} worker(s)) ran "
            f"{'/'.join(others)} threads per rank, this run {row.threads_per_rank}; sweep with one --threads"
        )
        return
    row.baseline_workers = base.workers
    row.speedup = speedup(row.throughput, base.throughput)
    row.efficiency = scaling_efficiency(row.throughput, row.workers, base.throughput, base.workers)
    if row is not base:
        row.speedup_interval = intervals.ratio_interval(row.rounds, base.rounds)
        row.efficiency_interval = intervals.ratio_interval(row.rounds, base.rounds, base.workers / row.workers)
    if row.useful_per_step is not None and base.useful_per_step is not None:
        row.computation_scalability = computation_scalability(
            row.useful_per_step, row.workers, base.useful_per_step, base.workers, row.study.scaling
        )
        row.global_efficiency = global_efficiency(row.parallel_efficiency, row.computation_scalability)
    if row.study.scaling == "weak" and row is not base:
        spread = (
            None
            if base.throughput_interval is None
            else (base.throughput_interval[1] - base.throughput_interval[0]) / 2
        )
        row.suspect = suspect_weak_efficiency(
            row.efficiency, base.contended_runs > 0, row.contended_runs > 0, spread, base.throughput
        )


def _with_interval(value: Optional[float], interval: Optional[Interval], needed: bool = True) -> str:
    """'1.8 [1.7, 1.9]'; where an interval is `needed` but there is none, '1.8 [n/a (needs 3 rounds)]'."""
    if value is None:
        return "-"
    if interval is None:
        return f"{cell(value)} [{intervals.missing()}]" if needed else cell(value)
    return f"{cell(value)} [{cell(interval[0])}, {cell(interval[1])}]"


def _against_base(row: dict[str, Any], value: str) -> str:
    """The row's speedup or efficiency with its interval; none is needed for the baseline itself."""
    return _with_interval(row[value], row[f"{value}_interval"], row["workers"] != row["baseline_workers"])


def _efficiency(row: dict[str, Any]) -> str:
    return _against_base(row, "efficiency") + (f" {SUSPECT}" if row["suspect"] else "")


def _common(row: dict[str, Any]) -> str:
    if row["is_common_baseline"]:
        return cell(row["common_efficiency"])
    return _with_interval(row["common_efficiency"], row["common_efficiency_interval"])


SCALING_COLUMNS: Sequence[Column] = (
    ("backend", lambda r: r["label"] + (f" {CONTENDED}" if r["contended_runs"] else "")),
    ("workers", lambda r: r["workers"]),
    ("threads/rank", lambda r: r["threads_per_rank"]),
    ("runs", lambda r: r["runs"]),
    ("samples/s [95%]", lambda r: _with_interval(r["throughput"], r["throughput_interval"])),
    ("speedup [95%]", lambda r: _against_base(r, "speedup")),
    ("efficiency [95%]", _efficiency),
    ("vs common baseline [95%]", _common),
    ("AU", lambda r: r["au"]),
    ("load balance", lambda r: r["load_balance"]),
    ("comm. efficiency", lambda r: r["communication_efficiency"]),
    ("parallel efficiency", lambda r: r["parallel_efficiency"]),
    ("comp. scalability", lambda r: r["computation_scalability"]),
    ("global efficiency", lambda r: r["global_efficiency"]),
    ("state MiB/rank", lambda r: r["model_state_mib"]),
    ("peak MiB/rank", lambda r: r["peak_mib"]),
)


def _as_dict(row: ScalingRow) -> dict[str, Any]:
    return {**dataclasses.asdict(row), "label": row.label}


def scaling_report(records: Sequence[dict[str, Any]], explain: bool = False) -> str:
    """Markdown: per study, a heading, one row per backend x workers (see SCALING_COLUMNS) and one
    line per caveat (`_caveats`); then the definitions (`explain`) or where to read them."""
    rows = scaling_rows(records)
    if not rows:
        return "(no records with a timed window)"
    sections = []
    for study in sorted({row.study for row in rows}):
        mine = [row for row in rows if row.study == study]
        trained = [record for record in records if record.get("throughput") and study_of(record) == study]
        sections.append(
            f"### {study.title()}\n\n"
            + markdown_table([_as_dict(row) for row in mine], SCALING_COLUMNS)
            + "\n\n"
            + "\n".join(f"- {line}" for line in caveat_lines(mine, trained))
        )
    if explain:
        sections.append("### Definitions\n\n" + "\n".join(f"- {line}" for line in explanation()))
    else:
        sections.append(f"Definitions of the columns: {GLOSSARY}, or `harness report --explain`.")
    return "\n\n".join(sections)
