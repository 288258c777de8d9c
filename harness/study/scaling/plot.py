"""`harness plot`: scaling figures from results records, as PNG and SVG, sized for a slide.

For each study in the records (see report.Study) it writes three figures:
- throughput vs workers, one line per backend with its 95% interval, and each backend's ideal
  (linear from its own fewest-worker throughput) dashed in the same colour;
- scaling efficiency vs workers, one line per backend, ideal at 1.0;
- the mean step time per backend and worker count, stacked by phase (data wait, forward +
  backward, communication, optimizer, other).
Runs measured under contention (harness.training.metrics) are boxed in red (hatched bars) with a
legend entry; one rank with all cores (tag baseline=all-cores) is a star, never on a curve; a
backend swept at two thread counts gets two curves.
Beside each figure a JSON file lists its title, axes and series (one per backend), so tests and
notebooks can check a figure without reading pixels. Figures are drawn on matplotlib Figure
objects with the Agg renderer only: no display, no pyplot state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, Optional

from ...errors import UsageError, require
from ...fileio import atomic_write, atomic_write_json
from ...process.phases import STEP_COLUMNS
from .intervals import error_bars
from .report import ScalingRow, Study, scaling_rows
from .report_notes import unresolved_lines

FIGURE_KINDS = ("throughput", "efficiency", "breakdown")
FORMATS = ("png", "svg")
# One colour per backend in registry order, so a backend looks the same in every figure and study.
PALETTE = ("#555555", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
PHASE_STYLE = {
    "data_wait": ("data wait", "#bdbdbd"),
    "forward_backward": ("forward + backward", "#4c72b0"),
    "communication": ("communication (every collective)", "#dd8452"),
    "optimizer": ("optimizer", "#55a868"),
    "other": ("other (bookkeeping, barrier)", "#8172b3"),
}
# Legible on a projected slide: large text, thick lines, big markers.
SLIDE_STYLE = {
    "font.size": 15,
    "axes.titlesize": 16,
    "axes.labelsize": 15,
    "legend.fontsize": 13,
    "xtick.labelsize": 13,
    "ytick.labelsize": 13,
    "lines.linewidth": 2.8,
    "lines.markersize": 9,
    "axes.grid": True,
    "grid.alpha": 0.35,
    "svg.fonttype": "none",
}
FIGSIZE = (10, 6)
PLOT_INSTALL = "pip install matplotlib (make setup installs it)"
# Runs measured under contention (harness.training.metrics, **contention**): boxed points, hatched bars.
CONTENTION_COLOUR = "#c0392b"
CONTENTION_HATCH = "//"
CONTENTION_LABEL = "measured under contention (see report)"


def _colour(backend: str, order: Sequence[str]) -> str:
    from ...backends import BACKENDS

    known = list(BACKENDS)
    index = known.index(backend) if backend in known else len(known) + order.index(backend)
    return PALETTE[index % len(PALETTE)]


def _backends(rows: Sequence[ScalingRow]) -> list[str]:
    return list(dict.fromkeys(row.backend for row in rows))


def _curves(rows: Sequence[ScalingRow]) -> list[tuple[str, str, list[ScalingRow]]]:
    """(backend, label, rows) per scaling curve: one per backend and threads per rank (a backend
    swept at two thread counts gets two curves, never one mixing them); all-cores rows left out."""
    curves: dict[tuple[str, Optional[int]], list[ScalingRow]] = {}
    for row in rows:
        if not row.baseline:
            curves.setdefault((row.backend, row.threads_per_rank), []).append(row)
    several = {backend for backend, _ in curves if sum(1 for b, _ in curves if b == backend) > 1}
    return [
        (backend, f"{backend}, {threads} threads/rank" if backend in several else backend, mine)
        for (backend, threads), mine in curves.items()
    ]


def _workers_axis(ax: Any, rows: Sequence[ScalingRow]) -> None:
    workers = sorted({row.workers for row in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(workers)
    ax.set_xticklabels([str(w) for w in workers])
    ax.minorticks_off()
    ax.set_xlim(workers[0] / 1.3, workers[-1] * 1.3)
    ax.set_xlabel("workers (processes)")


def _dodged(workers: Sequence[int], index: int, count: int) -> list[float]:
    """x positions nudged apart per backend (log axis), so error bars at one worker count do not overlap."""
    return [w * 2 ** (0.04 * (index - (count - 1) / 2)) for w in workers]


def _title(ax: Any, what: str, study: Study) -> str:
    title = f"{what}\n{study.title()}"
    ax.set_title(title)
    return title


def _series(
    backend: str, label: str, mine: Sequence[ScalingRow], value: Callable[[ScalingRow], Optional[float]]
) -> dict[str, Any]:
    return {
        "backend": backend,
        "label": label,
        "workers": [row.workers for row in mine],
        "values": [value(row) for row in mine],
        "contended": [row.contended_runs > 0 for row in mine],
        "threads_per_rank": mine[0].threads_per_rank,
    }


def _mark_contended(ax: Any, xs: Sequence[float], values: Sequence[Optional[float]], flags: Sequence[bool]) -> bool:
    """A hollow red square around each point measured under contention; whether there was one."""
    marked = [(x, v) for x, v, flag in zip(xs, values, flags) if flag and v is not None]
    if marked:
        ax.scatter(
            [x for x, _ in marked],
            [v for _, v in marked],
            s=380,
            marker="s",
            facecolors="none",
            edgecolors=CONTENTION_COLOUR,
            linewidths=2.2,
            zorder=5,
            label="_contended",
        )
    return bool(marked)


def _legend(ax: Any, contended: bool, extra: Sequence[tuple[Any, str]] = (), loc: str = "upper left") -> None:
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    for handle, label in extra:
        handles.append(handle)
        labels.append(label)
    if contended:
        handles.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="s",
                markersize=13,
                markerfacecolor="none",
                markeredgecolor=CONTENTION_COLOUR,
                markeredgewidth=2.2,
            )
        )
        labels.append(CONTENTION_LABEL)
    ax.legend(handles, labels, loc=loc)


def _draw_all_cores(ax: Any, all_cores: Sequence[ScalingRow], order: Sequence[str]) -> bool:
    """Each one-rank-with-all-cores run as a star (not a baseline); whether any was contended."""
    contended = False
    for row in all_cores:
        ax.scatter(
            [row.workers],
            [row.throughput],
            marker="*",
            s=340,
            color=_colour(row.backend, order),
            edgecolors="black",
            zorder=4,
            label="_all_cores",
        )
        contended |= _mark_contended(ax, [row.workers], [row.throughput], [row.contended_runs > 0])
    return contended


def _throughput_legend_extras(ideals: bool, all_cores: bool) -> list[tuple[Any, str]]:
    """The legend's entries for the dashed ideal lines and the all-cores stars, where drawn."""
    from matplotlib.lines import Line2D

    extra = []
    if ideals:
        extra.append(
            (Line2D([], [], linestyle="--", linewidth=1.6, color="black"), "ideal (linear from fewest workers)")
        )
    if all_cores:
        marker = Line2D([], [], linestyle="none", marker="*", markersize=16, color="grey", markeredgecolor="black")
        extra.append((marker, "1 rank x all cores (not a baseline)"))
    return extra


def throughput_figure(rows: Sequence[ScalingRow], study: Study) -> Any:
    """Throughput (samples/s) vs workers, one line per backend with its 95% interval, its dashed ideal,
    runs under contention boxed in red, one rank with all cores as a star; returns the Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    order, curves = _backends(rows), _curves(rows)
    series, ideals, contended = [], [], False
    for index, (backend, label, mine) in enumerate(curves):
        entry = _series(backend, label, mine, lambda row: row.throughput)
        entry["interval"] = [row.throughput_interval for row in mine]
        colour = _colour(backend, order)
        xs = _dodged(entry["workers"], index, len(curves))
        ax.errorbar(
            xs,
            entry["values"],
            yerr=error_bars(entry["values"], entry["interval"]),
            label=label,
            color=colour,
            marker="o",
            capsize=5,
        )
        contended |= _mark_contended(ax, xs, entry["values"], entry["contended"])
        ideal = [mine[0].throughput * w / mine[0].workers for w in entry["workers"]]
        if len(ideal) > 1:
            ax.plot(xs, ideal, linestyle="--", linewidth=1.6, color=colour, label="_ideal")
            ideals.append({"backend": backend, "label": label, "workers": entry["workers"], "values": ideal})
        series.append(entry)
    all_cores = [row for row in rows if row.baseline]
    contended |= _draw_all_cores(ax, all_cores, order)
    _legend(ax, contended, _throughput_legend_extras(bool(ideals), bool(all_cores)))
    _workers_axis(ax, rows)
    ax.set_ylabel("throughput (samples/s)")
    ax.set_ylim(bottom=0)
    fig.harness_metadata = {
        "figure": "throughput",
        "title": _title(ax, "Throughput vs workers", study),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "series": series,
        "ideal": ideals,
        "all_cores": [
            {"backend": r.backend, "throughput": r.throughput, "threads_per_rank": r.threads_per_rank}
            for r in all_cores
        ],
        "contention_marked": contended,
    }
    return fig


def efficiency_figure(rows: Sequence[ScalingRow], study: Study) -> Any:
    """Scaling efficiency (speedup / workers) vs workers, one line per backend; runs under contention
    boxed in red, a suspect weak-scaling efficiency (> 1.05) labelled; returns the Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    order, curves = _backends(rows), _curves(rows)
    series, contended = [], False
    for index, (backend, label, mine) in enumerate(curves):
        entry = _series(backend, label, mine, lambda row: row.efficiency)
        entry["suspect"] = [row.suspect for row in mine]
        entry["interval"] = [row.efficiency_interval for row in mine]
        xs = _dodged(entry["workers"], index, len(curves))
        ax.errorbar(
            xs,
            [v if v is not None else float("nan") for v in entry["values"]],
            yerr=error_bars(entry["values"], entry["interval"]),
            label=label,
            color=_colour(backend, order),
            marker="o",
            capsize=5,
        )
        contended |= _mark_contended(ax, xs, entry["values"], entry["contended"])
        for x, value, why in zip(xs, entry["values"], entry["suspect"]):
            if why and value is not None:
                ax.annotate(
                    "suspect (> 1.05)",
                    xy=(x, value),
                    xytext=(8, 8),
                    textcoords="offset points",
                    color=CONTENTION_COLOUR,
                    fontsize=12,
                )
        series.append(entry)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1.6, label="ideal (1.0)")
    _workers_axis(ax, rows)
    ax.set_ylabel("scaling efficiency (speedup / workers), 95% interval")
    unresolved = unresolved_lines(rows)
    if unresolved:
        ax.text(0.99, 0.02, "\n".join(unresolved), transform=ax.transAxes, ha="right", va="bottom", fontsize=11)
    top = max([1.0, *(b[1] for entry in series for b in entry["interval"] if b is not None)])
    top = max([top, *(v for entry in series for v in entry["values"] if v is not None)])
    ax.set_ylim(0, top * 1.15)
    _legend(ax, contended, loc="lower left")
    fig.harness_metadata = {
        "figure": "efficiency",
        "title": _title(ax, "Scaling efficiency vs workers", study),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "series": series,
        "ideal": 1.0,
        "contention_marked": contended,
        "notes": [row.note for row in rows if row.note],
        "not_resolved": unresolved,
    }
    return fig


def _label_bar_groups(
    ax: Any, rows: Sequence[ScalingRow], positions: Sequence[float], groups: dict[str, list[float]]
) -> None:
    """Each bar's worker count under it, and each backend's name under its group of bars (one option
    per line, so that a configuration's options do not run into the next group's name)."""
    ax.set_xticks(positions)
    ax.set_xticklabels([f"{row.workers}*" if row.baseline else str(row.workers) for row in rows])
    for backend, spots in groups.items():
        ax.annotate(
            backend.replace(" ", "\n"),
            xy=(sum(spots) / len(spots), 0),
            xycoords=("data", "axes fraction"),
            xytext=(0, -28),
            textcoords="offset points",
            ha="center",
            va="top",
            fontweight="bold",
        )
    ax.set_xlabel(
        "workers, per backend (* = 1 rank x all cores)" if any(r.baseline for r in rows) else "workers, per backend",
        labelpad=30 + 14 * max(backend.count(" ") for backend in groups),
    )
    ax.grid(False, axis="x")


def breakdown_figure(rows: Sequence[ScalingRow], study: Study) -> Any:
    """Mean time per step (ms) per backend and worker count, stacked by phase; bars of runs under
    contention hatched; returns the Figure."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=FIGSIZE, layout="constrained")
    ax = fig.add_subplot()
    positions, position = [], 0.0
    groups: dict[str, list[float]] = {}
    for row in rows:  # grouped by backend, workers ascending: leave a gap between backends
        position += 1.0 if not groups or row.backend in groups else 1.7
        positions.append(position)
        groups.setdefault(row.backend, []).append(position)
    hatches = [CONTENTION_HATCH if row.contended_runs else None for row in rows]
    bottoms = [0.0] * len(rows)
    stacks = []
    for phase in STEP_COLUMNS:
        label, colour = PHASE_STYLE[phase]
        heights = [1000 * (row.seconds_per_step.get(phase) or 0.0) for row in rows]
        ax.bar(
            positions,
            heights,
            bottom=bottoms,
            width=0.8,
            label=label,
            color=colour,
            hatch=hatches,
            edgecolor="white" if any(hatches) else None,
        )
        bottoms = [b + h for b, h in zip(bottoms, heights)]
        stacks.append({"phase": phase, "label": label, "values_ms": heights})
    _label_bar_groups(ax, rows, positions, groups)
    ax.set_ylabel("time per step (ms, mean over ranks)")
    ax.set_ylim(0, max(bottoms + [1e-3]) * 1.3)
    # Plain patches: the legend would otherwise take the first bar's hatching for its phase.
    handles = [Patch(facecolor=colour, label=label) for label, colour in (PHASE_STYLE[p] for p in STEP_COLUMNS)]
    if any(hatches):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch=CONTENTION_HATCH, label=CONTENTION_LABEL))
    ax.legend(handles=handles, loc="upper left", ncols=2)
    fig.harness_metadata = {
        "figure": "breakdown",
        "title": _title(ax, "Where a training step's time goes", study),
        "xlabel": ax.get_xlabel(),
        "ylabel": ax.get_ylabel(),
        "bars": [
            {
                "backend": row.backend,
                "workers": row.workers,
                "baseline": row.baseline,
                "contended": row.contended_runs > 0,
            }
            for row in rows
        ],
        "series": [{"backend": b} for b in _backends(rows)],
        "stacks": stacks,
    }
    return fig


FIGURES: dict[str, Callable[[Sequence[ScalingRow], Study], Any]] = {
    "throughput": throughput_figure,
    "efficiency": efficiency_figure,
    "breakdown": breakdown_figure,
}


def _save(fig: Any, stem: str) -> list[str]:
    written = []
    for fmt in FORMATS:
        path = f"{stem}.{fmt}"
        atomic_write(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=150))
        written.append(path)
    metadata = {**fig.harness_metadata, "files": list(written)}
    path = f"{stem}.json"
    atomic_write_json(path, metadata)
    return [*written, path]


def scaling_figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of every study in `records`, as matplotlib Figures keyed by file stem suffix.

    With one study the keys are the kinds ("throughput", "efficiency", "breakdown"); with several,
    each key carries the study's slug ("weak-cnn-synthetic-b64-cpu-throughput"). Figures use the
    slide style and no pyplot state; in a notebook, display one by evaluating it.
    """
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    rows = scaling_rows(records)
    if not rows:
        raise UsageError(
            "no records with a timed window to plot; run `harness sweep` (or train with more "
            "steps than --timing-warmup-steps) first"
        )
    studies = sorted({row.study for row in rows})
    figures: dict[str, Any] = {}
    with rc_context(SLIDE_STYLE):
        for study in studies:
            mine = [row for row in rows if row.study == study]
            for kind, draw in FIGURES.items():
                figures[kind if len(studies) == 1 else f"{study.slug()}-{kind}"] = draw(mine, study)
    return figures


def write_figures(records: Sequence[dict[str, Any]], prefix: str) -> list[str]:
    """scaling_figures(records) saved as PREFIX-KEY.{png,svg,json}; the paths written."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    written: list[str] = []
    with rc_context(SLIDE_STYLE):
        for key, figure in scaling_figures(records).items():
            written += _save(figure, f"{prefix}-{key}")
    return written
