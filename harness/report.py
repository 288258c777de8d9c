"""Tables from results records (Markdown, readable in a terminal and in a notebook)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

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
