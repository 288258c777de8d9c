"""`harness plot`: scaling figures from results records, as PNG and SVG, sized for a slide.

For each study in the records (see report.Study) it writes three figures:
- throughput vs workers, one line per backend with its 95% interval, and each backend's ideal
  (linear from its own fewest-worker throughput) dashed in the same colour;
- scaling efficiency vs workers, one line per backend, ideal at 1.0;
- the mean step time per backend and worker count, stacked by phase (data wait, forward +
  backward, communication, optimizer, other).
Beside each figure a JSON file lists its title, axes and series (one per backend), so tests and
notebooks can check a figure without reading pixels. Figures are drawn on matplotlib Figure
objects with the Agg renderer only: no display, no pyplot state.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import UsageError
from ..fileio import atomic_write
from ..training.metrics import STEP_PHASES
from .report import ScalingRow, Study, scaling_rows

FIGURE_KINDS = ("throughput", "efficiency", "breakdown")
FORMATS = ("png", "svg")
# One colour per backend in registry order, so a backend looks the same in every figure and study.
PALETTE = ("#555555", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
PHASE_STYLE = {
    "data_wait": ("data wait", "#bdbdbd"),
    "forward_backward": ("forward + backward", "#4c72b0"),
    "communication": ("communication (gradient sync)", "#dd8452"),
    "optimizer": ("optimizer", "#55a868"),
    "other": ("other (bookkeeping, barrier)", "#8172b3"),
}
# Legible on a projected slide: large text, thick lines, big markers.
SLIDE_STYLE = {"font.size": 15, "axes.titlesize": 16, "axes.labelsize": 15, "legend.fontsize": 13,
               "xtick.labelsize": 13, "ytick.labelsize": 13, "lines.linewidth": 2.8, "lines.markersize": 9,
               "axes.grid": True, "grid.alpha": 0.35, "svg.fonttype": "none"}
FIGSIZE = (10, 6)


def _colour(backend: str, order: Sequence[str]) -> str:
    from ..backends import BACKENDS

    known = list(BACKENDS)
    index = known.index(backend) if backend in known else len(known) + order.index(backend)
    return PALETTE[index % len(PALETTE)]


def _backends(rows: Sequence[ScalingRow]) -> List[str]:
    return list(dict.fromkeys(row.backend for row in rows))


def _workers_axis(ax: Any, rows: Sequence[ScalingRow]) -> None:
    workers = sorted({row.workers for row in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.minorticks_off()
    ax.set_xlim(workers[0] / 1.3, workers[-1] * 1.3)
    ax.set_xlabel("workers (processes)")


def _dodged(workers: Sequence[int], index: int, count: int) -> List[float]:
    """x positions nudged apart per backend (log axis), so error bars at one worker count do not overlap."""
    return [w * 2 ** (0.04 * (index - (count - 1) / 2)) for w in workers]


def _title(ax: Any, what: str, study: Study) -> str:
    title = f"{what}\n{study.title()}"
    ax.set_title(title)
    return title


def _series(rows: Sequence[ScalingRow], backend: str, value: Callable[[ScalingRow], Optional[float]]) -> Dict[str, Any]:
    mine = [row for row in rows if row.backend == backend]
    return {"backend": backend, "label": backend, "workers": [row.workers for row in mine],
            "values": [value(row) for row in mine]}


def throughput_figure(rows: Sequence[ScalingRow], study: Study) -> Any:
    """Throughput (samples/s) vs workers, one line per backend plus its dashed ideal; returns the Figure."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    order = _backends(rows)
    series, ideals = [], []
    for index, backend in enumerate(order):
        entry = _series(rows, backend, lambda row: row.throughput)
        entry["ci95"] = [row.throughput_ci95 for row in rows if row.backend == backend]
        colour = _colour(backend, order)
        xs = _dodged(entry["workers"], index, len(order))
        ax.errorbar(xs, entry["values"], yerr=[c or 0.0 for c in entry["ci95"]], label=backend,
                    color=colour, marker="o", capsize=5)
        base = next(row for row in rows if row.backend == backend)
        ideal = [base.throughput * w / base.workers for w in entry["workers"]]
        if len(ideal) > 1:
            ax.plot(xs, ideal, linestyle="--", linewidth=1.6, color=colour, label="_ideal")
            ideals.append({"backend": backend, "workers": entry["workers"], "values": ideal})
        series.append(entry)
    handles, labels = ax.get_legend_handles_labels()
    if ideals:
        handles.append(Line2D([], [], linestyle="--", linewidth=1.6, color="black"))
        labels.append("ideal (linear from fewest workers)")
    ax.legend(handles, labels, loc="upper left")
    _workers_axis(ax, rows)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    fig.harness_metadata = {"figure": "throughput", "title": _title(ax, "Throughput vs workers", study),
                            "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "series": series,
                            "ideal": ideals}
    return fig


def efficiency_figure(rows: Sequence[ScalingRow], study: Study) -> Any:
    """Scaling efficiency (speedup / workers) vs workers, one line per backend; returns the Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    order = _backends(rows)
    series = []
    for index, backend in enumerate(order):
        entry = _series(rows, backend, lambda row: row.efficiency)
        ax.plot(_dodged(entry["workers"], index, len(order)), entry["values"], label=backend,
                color=_colour(backend, order), marker="o")
        series.append(entry)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1.6, label="ideal (1.0)")
    _workers_axis(ax, rows)
    ax.set_ylabel("scaling efficiency (speedup / workers)")
    top = max([1.0, *(v for entry in series for v in entry["values"] if v is not None)])
    ax.set_ylim(0, top * 1.15)
    ax.legend(loc="lower left")
    fig.harness_metadata = {"figure": "efficiency", "title": _title(ax, "Scaling efficiency vs workers", study),
                            "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(), "series": series,
                            "ideal": 1.0}
    return fig


def breakdown_figure(rows: Sequence[ScalingRow], study: Study) -> Any:
    """Mean time per step (ms) per backend and worker count, stacked by phase; returns the Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    positions, position = [], 0.0
    groups: Dict[str, List[float]] = {}
    for row in rows:  # grouped by backend, workers ascending: leave a gap between backends
        position += 1.0 if not groups or row.backend in groups else 1.7
        positions.append(position)
        groups.setdefault(row.backend, []).append(position)
    bottoms = [0.0] * len(rows)
    stacks = []
    for phase in STEP_PHASES:
        label, colour = PHASE_STYLE[phase]
        heights = [1000 * (row.seconds_per_step.get(phase) or 0.0) for row in rows]
        ax.bar(positions, heights, bottom=bottoms, width=0.8, label=label, color=colour)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
        stacks.append({"phase": phase, "label": label, "values_ms": heights})
    ax.set_xticks(positions)
    ax.set_xticklabels([str(row.workers) for row in rows])
    for backend, spots in groups.items():  # the backend's name under its group of bars
        ax.annotate(backend, xy=(sum(spots) / len(spots), 0), xycoords=("data", "axes fraction"),
                    xytext=(0, -28), textcoords="offset points", ha="center", va="top", fontweight="bold")
    ax.set_xlabel("workers, per backend", labelpad=30)
    ax.grid(False, axis="x")
    ax.set_ylabel("time per step (ms, mean over ranks)")
    ax.set_ylim(0, max(bottoms + [1e-3]) * 1.3)
    ax.legend(loc="upper left", ncols=2)
    fig.harness_metadata = {"figure": "breakdown", "title": _title(ax, "Where a training step's time goes", study),
                            "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
                            "bars": [{"backend": row.backend, "workers": row.workers} for row in rows],
                            "series": [{"backend": b} for b in _backends(rows)], "stacks": stacks}
    return fig


FIGURES: Dict[str, Callable[[Sequence[ScalingRow], Study], Any]] = {
    "throughput": throughput_figure, "efficiency": efficiency_figure, "breakdown": breakdown_figure}


def _save(fig: Any, stem: str) -> List[str]:
    written = []
    for fmt in FORMATS:
        path = f"{stem}.{fmt}"
        atomic_write(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=150))
        written.append(path)
    metadata = {**fig.harness_metadata, "files": list(written)}
    path = f"{stem}.json"
    atomic_write(path, lambda tmp: _write_json(tmp, metadata))
    return [*written, path]


def _write_json(path: str, data: Dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(data, handle, indent=1, allow_nan=False)


def scaling_figures(records: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Every figure of every study in `records`, as matplotlib Figures keyed by file stem suffix.

    With one study the keys are the kinds ("throughput", "efficiency", "breakdown"); with several,
    each key carries the study's slug ("weak-cnn-synthetic-b64-cpu-throughput"). Figures use the
    slide style and no pyplot state; in a notebook, display one by evaluating it.
    """
    from matplotlib import rc_context

    rows = scaling_rows(records)
    if not rows:
        raise UsageError("no records with a timed window to plot; run `harness sweep` (or train with more "
                         "steps than --timing-warmup-steps) first")
    studies = sorted({row.study for row in rows})
    figures: Dict[str, Any] = {}
    with rc_context(SLIDE_STYLE):
        for study in studies:
            mine = [row for row in rows if row.study == study]
            for kind, draw in FIGURES.items():
                figures[kind if len(studies) == 1 else f"{study.slug()}-{kind}"] = draw(mine, study)
    return figures


def write_figures(records: Sequence[Dict[str, Any]], prefix: str) -> List[str]:
    """scaling_figures(records) saved as PREFIX-KEY.{png,svg,json}; the paths written."""
    from matplotlib import rc_context

    written: List[str] = []
    with rc_context(SLIDE_STYLE):
        for key, figure in scaling_figures(records).items():
            written += _save(figure, f"{prefix}-{key}")
    return written


def timeline_figure(record: Dict[str, Any], steps: Optional[int] = None) -> Any:
    """Each rank's traced steps as bars over time, coloured by phase (data wait, forward + backward
    + gradient sync, optimizer); white gaps are bookkeeping and barriers. Needs a record of a run with
    --trace-steps > 0. Returns the Figure."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    timeline = record.get("timeline")
    if not timeline or not any(timeline["per_rank"]):
        raise UsageError("this record has no per-rank timeline; train with --trace-steps N (e.g. 8) to record one")
    colours = {"data_wait": PHASE_STYLE["data_wait"][1], "forward_backward_sync": PHASE_STYLE["forward_backward"][1],
               "optimizer": PHASE_STYLE["optimizer"][1]}
    labels = {"data_wait": "data wait", "forward_backward_sync": "forward + backward + gradient sync",
              "optimizer": "optimizer"}
    with rc_context(SLIDE_STYLE):
        fig = Figure(figsize=(FIGSIZE[0], 1.6 + 0.9 * len(timeline["per_rank"])), layout="constrained")
        ax = fig.add_subplot()
        for rank, traced in enumerate(timeline["per_rank"]):
            for step in traced[:steps]:
                for phase, (begin, end) in zip(timeline["phases"], step):
                    ax.broken_barh([(1000 * begin, 1000 * (end - begin))], (rank - 0.35, 0.7),
                                   color=colours[phase], label=labels[phase])
        handles, names = ax.get_legend_handles_labels()
        unique = dict(zip(names, handles))
        ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.25), ncols=3)
        ax.set_yticks(range(len(timeline["per_rank"])))
        ax.set_yticklabels([f"rank {rank}" for rank in range(len(timeline["per_rank"]))])
        ax.invert_yaxis()
        ax.set_xlabel("time since the timed window opened (ms)")
        ax.grid(False, axis="y")
        ax.set_title(f"Per-rank step timeline: {record['backend']}, {record['world_size']} ranks, "
                     f"{record['model']}, batch {record['local_batch']} per rank")
    return fig


def loss_figure(records: Sequence[Dict[str, Any]], labels: Sequence[str], title: str = "Training loss") -> Any:
    """Training loss against optimizer step for several runs (from each record's `history`), one
    labelled line each, on a log scale. Returns the Figure."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    with rc_context(SLIDE_STYLE):
        fig = Figure(figsize=FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        for record, label in zip(records, labels):
            history = record["history"]
            ax.plot(history["step"], history["loss"], label=label)
        ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (mean over ranks and samples)")
        ax.set_title(title)
        ax.legend(loc="upper right")
    return fig
