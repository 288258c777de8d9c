"""The lines under a scaling table (harness.study.scaling.report): one per caveat that applies to its
study (a baseline refused, contention, a suspect efficiency, the common baseline, what no interval
ranks, intervals missing for too few rounds), and the definitions `harness report --explain` prints
(docs/concepts/measurement.md says the same words); `require_runs` refuses input with no run. Also
what both the table and these lines use: how a number is written (`cell`), the marks, each row's
common baseline and the configurations no interval ranks (`unresolved_lines`, which the figures print)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from ...errors import UsageError
from ...training.metrics import DEFINITIONS
from . import intervals
from .task_spec import task_lines

if TYPE_CHECKING:
    from .report import ScalingRow

CONTENDED = "†"  # marks a row with runs measured under contention
SUSPECT = "?"  # marks a suspect efficiency
GLOSSARY = "docs/concepts/measurement.md"  # the definitions, word for word (tests/unit/test_definitions.py)
# The definitions the scaling table's columns use, printed by `harness report --explain`.
FOOTNOTE_TERMS = (
    "speedup",
    "scaling efficiency",
    "compute time",
    "AU",
    "useful time",
    "communication",
    "load balance",
    "communication efficiency",
    "parallel efficiency",
    "serialisation and transfer",
    "computation scalability",
    "global efficiency",
    "contention",
)


def cell(value: Any) -> str:
    """A table cell: '-' for None, four significant digits (thousands whole)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def common_baseline(row: ScalingRow, rows: Sequence[ScalingRow]) -> Optional[ScalingRow]:
    """The study's common baseline for `row`: the fastest single-process run (any configuration)
    with the same work per rank (threads per rank), or None where the study has none."""
    alone = [
        other
        for other in rows
        if other.study == row.study
        and other.workers == 1
        and not other.baseline
        and other.threads_per_rank == row.threads_per_rank
    ]
    return max(alone, key=lambda other: other.throughput, default=None)


def configurations_by_work(rows: Sequence[ScalingRow]) -> list[list[ScalingRow]]:
    """The scaling rows (no all-cores runs) grouped by threads per rank: each group shares a common baseline."""
    threads = sorted({row.threads_per_rank or 0 for row in rows})
    groups = [[row for row in rows if (row.threads_per_rank or 0) == t and not row.baseline] for t in threads]
    return [group for group in groups if group]


def unresolved(rows: Sequence[ScalingRow]) -> list[tuple[str, bool]]:
    """(line, whether the rounds were too few for an interval at all), per set of configurations at one
    worker count whose 95% intervals against the common baseline overlap or are missing."""
    found = []
    for mine in configurations_by_work(rows):
        for workers in sorted({row.workers for row in mine}):
            peers = {row.label: row for row in mine if row.workers == workers}
            for group in intervals.unresolved_groups(
                {label: row.common_efficiency_interval for label, row in peers.items()}
            ):
                runs = min(peers[label].runs for label in group)
                too_few = any(peers[label].common_efficiency_interval is None for label in group)
                why = f" (an interval needs {intervals.MIN_ROUNDS} rounds)" if too_few else ""
                found.append((f"x{workers}: {', '.join(group)}: not resolved at {runs} repeats{why}", too_few))
    return found


def unresolved_lines(rows: Sequence[ScalingRow]) -> list[str]:
    """One line per set of configurations at one worker count that no interval ranks:
    'x2: ddp, fsdp: not resolved at 3 repeats'."""
    return [line for line, _ in unresolved(rows)]


def caveat_lines(rows: Sequence[ScalingRow], records: Sequence[dict[str, Any]] = ()) -> list[str]:
    """One line per thing a reader must know about these rows (and the task their `records`
    trained): baselines refused, contention, suspect efficiencies, the common baseline, what is not
    resolved and intervals missing for too few rounds."""
    lines = task_lines(records) + [row.note for row in rows if row.note]
    for row in rows:
        if row.contended_runs:
            lines.append(
                f"{CONTENDED} {row.label} x{row.workers}: {row.contended_runs} of {row.runs} run(s) measured "
                f"under contention: {'; '.join(row.contention[:2])}"
            )
        if row.suspect:
            lines.append(
                f"{SUSPECT} {row.label} x{row.workers}: weak-scaling efficiency {row.efficiency:.2f} > 1.05 "
                f"is suspect: {row.suspect}"
            )
    lines += _baseline_lines(rows)
    short = [row for row in rows if len(row.rounds) < intervals.MIN_ROUNDS]
    if short:
        fewest = min(len(row.rounds) for row in short)
        lines.append(
            f"{intervals.missing()}: {len(short)} of {len(rows)} row(s) ran in {fewest} round(s), too few for a "
            f"95% interval; sweep with --repeats {intervals.MIN_ROUNDS} or more"
        )
    return lines


def explanation() -> list[str]:
    """What the table's intervals and columns mean: `harness report --explain` prints it."""
    return [
        f"[95%]: Student's t interval on logarithms over the interleave rounds (none below "
        f"{intervals.MIN_ROUNDS}): throughput's of the mean of the runs' log throughputs, speedup's and "
        "efficiency's of the mean log ratio of each run to its baseline's run of the same round. AU, POP "
        "metrics and memory are means over runs.",
        "state MiB/rank: the largest rank's weights (or shard), gradients, optimizer state and the framework's "
        "other tensors (record: memory.model_state_bytes_per_rank); peak MiB/rank: the largest rank's peak "
        "memory over the timed window (the allocator's on a GPU, the resident set on the CPU)",
        *(DEFINITIONS[term] for term in FOOTNOTE_TERMS),
    ]


def _baseline_lines(rows: Sequence[ScalingRow]) -> list[str]:
    """The common baseline, and the configurations each worker count cannot rank."""
    lines = []
    for mine in configurations_by_work(rows):
        common = common_baseline(mine[0], rows)
        if common is not None:
            lines.append(
                f"vs common baseline: efficiency against {common.label} x1 at {cell(common.throughput)} samples/s, "
                f"the fastest single-process run with {common.threads_per_rank or 'the same'} thread(s) per rank"
            )
    return lines + [
        line
        + ("" if too_few else " (their intervals against the common baseline overlap)")
        + ": no ranking between them"
        for line, too_few in unresolved(rows)
    ]


def require_runs(records: Sequence[dict[str, Any]], where: str) -> None:
    """UsageError naming the fix where `records` (read from `where`) hold no run with a timed window."""
    runs = [record for record in records if "world_size" in record and "backend" in record]
    if not runs:
        raise UsageError(
            f"{where} holds no run records; give the results file of runs "
            "(`harness sweep --results FILE` or `harness train --results FILE` writes one)"
        )
    if not any(run.get("throughput") for run in runs):
        raise UsageError(f"no run in {where} reached its timed window; run more steps than --timing-warmup-steps")
