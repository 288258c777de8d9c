"""Figures of single runs and of a prediction: a run's per-rank step timeline, its merged profiler
trace (every rank's threads on one clock), training loss per step, and predicted against measured step times and efficiency (the scaling figures of a study are
harness.study.scaling.plot's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from ...errors import UsageError, require
from .intervals import error_bars
from .plot import FIGSIZE, PALETTE, PHASE_STYLE, PLOT_INSTALL, SLIDE_STYLE, _legend, _mark_contended, _save


def _lane_bars(
    ax: Any, lanes: Sequence[tuple[str, Sequence[tuple[str, float, float]]]], style: Mapping[str, Any]
) -> None:
    """Each lane (label, [(kind, start s, end s)]) as a row of bars, the first on top, coloured and
    named by kind (`style`: kind -> (legend label, colour)), with one legend entry per kind."""
    for row, (_, spans) in enumerate(lanes):
        for kind, start, end in spans:
            label, colour = style[kind]
            ax.broken_barh([(1000 * start, 1000 * (end - start))], (row - 0.35, 0.7), color=colour, label=label)
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles))
    ax.legend(unique.values(), unique.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.25), ncols=2)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for label, _ in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.grid(False, axis="y")


def timeline_figure(record: dict[str, Any], steps: Optional[int] = None) -> Any:
    """Each rank's traced steps as bars over time, coloured by phase (data wait, forward + backward,
    communication, optimizer); white gaps are bookkeeping and barriers. Needs a record of a run with
    --trace-steps > 0. Returns the Figure."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    from matplotlib.figure import Figure

    timeline = record.get("timeline")
    if not timeline or not any(timeline["per_rank"]):
        raise UsageError("this record has no per-rank timeline; train with --trace-steps N (e.g. 8) to record one")
    # "forward_backward_sync": records from before communication was split off the gradient phase
    style = {
        **PHASE_STYLE,
        "forward_backward_sync": ("forward + backward + gradient sync", PHASE_STYLE["forward_backward"][1]),
    }
    lanes = [
        (
            f"rank {rank}",
            [(phase, begin, end) for step in traced[:steps] for phase, (begin, end) in zip(timeline["phases"], step)],
        )
        for rank, traced in enumerate(timeline["per_rank"])
    ]
    with rc_context(SLIDE_STYLE):
        fig = Figure(figsize=(FIGSIZE[0], 1.6 + 0.9 * len(lanes)), layout="constrained")
        ax = fig.add_subplot()
        _lane_bars(ax, lanes, style)
        ax.set_xlabel("time since the timed window opened (ms)")
        ax.set_title(
            f"Per-rank step timeline: {record['backend']}, {record['world_size']} ranks, "
            f"{record['model']}, batch {record['local_batch']} per rank"
        )
    return fig


# The kinds of harness.study.scaling.trace.trace_spans: the training thread's in the phases' colours.
TRACE_STYLE = {
    "forward": ("forward", PHASE_STYLE["forward_backward"][1]),
    "backward": ("backward", "#9ab5dc"),
    "gradient sync": ("waiting for the averaged gradients", PHASE_STYLE["communication"][1]),
    "optimizer": PHASE_STYLE["optimizer"],
    "allreduce": ("allreduce (communicator thread)", "#c44e52"),
}


def trace_figure(path: str, title: str = "") -> Any:
    """The merged trace of `harness train --profile-trace DIR` (DIR/trace.json) as a timeline: per
    rank, a row for its training thread (forward, backward, waiting for the averaged gradients,
    optimizer) and a row below it for its allreduces on the communicator's threads, on the trace's
    one clock (harness.study.scaling.trace.trace_spans). Returns the Figure; UsageError if `path` is not a
    merged trace."""
    from .trace import trace_spans

    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    from matplotlib.figure import Figure

    lanes = [
        (f"rank {rank} {lane}", spans)
        for rank, rank_lanes in trace_spans(path).items()
        for lane, spans in rank_lanes.items()
    ]
    if not lanes:
        raise UsageError(f"{path} holds no profiled steps; train with --profile-trace DIR and plot DIR/trace.json")
    with rc_context(SLIDE_STYLE):
        fig = Figure(figsize=(FIGSIZE[0] + 4, 2.2 + 0.8 * len(lanes)), layout="constrained")
        ax = fig.add_subplot()
        _lane_bars(ax, lanes, TRACE_STYLE)
        ax.set_xlabel("time since the first profiled step of any rank (ms, one clock)")
        ax.set_title(title or "Every rank's profiled steps (torch.profiler, merged trace)")
    return fig


def loss_figure(
    records: Sequence[dict[str, Any]],
    labels: Sequence[str],
    title: str = "Training loss",
    colours: Optional[Mapping[str, str]] = None,
) -> Any:
    """Training loss against optimizer step for several runs (from each record's `history`), one
    labelled line each, on a log scale; `colours` (label -> colour) keeps each run's colour the same
    across a notebook's figures. Returns the Figure."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    from matplotlib.figure import Figure

    with rc_context(SLIDE_STYLE):
        fig = Figure(figsize=FIGSIZE, layout="constrained")
        ax = fig.add_subplot()
        for record, label in zip(records, labels):
            history = record["history"]
            ax.plot(history["step"], history["loss"], label=label, color=(colours or {}).get(label))
        ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (mean over ranks and samples)")
        ax.set_title(title)
        ax.legend(loc="upper right")
    return fig


def _draw_measured(
    step_ax: Any, efficiency_ax: Any, rows: Sequence[dict[str, Any]], measured: Mapping[int, dict[str, Any]]
) -> bool:
    """The measured steps (by world size) at their node counts, with their intervals, and their
    efficiency against the 1-node step; whether any was measured under contention."""
    nodes_of = {row["ranks"]: row["nodes"] for row in rows}  # measured steps are keyed by world size
    points = sorted((nodes_of[r], m) for r, m in measured.items() if m.get("mean") and r in nodes_of)
    if not points:
        return False
    xs, means = [n for n, _ in points], [m["mean"] for _, m in points]
    step_ax.errorbar(
        xs,
        [1e3 * v for v in means],
        yerr=[[1e3 * bar for bar in side] for side in error_bars(means, [m.get("interval") for _, m in points])],
        linestyle="none",
        marker="D",
        color=PALETTE[2],
        capsize=5,
        label="measured (95% interval)",
    )
    contended = _mark_contended(step_ax, xs, [1e3 * v for v in means], [m.get("contended") for _, m in points])
    base = dict(points).get(1, {}).get("mean")
    if base:
        efficiency_ax.plot(
            xs, [base / v for v in means], linestyle="none", marker="D", color=PALETTE[2], label="measured"
        )
    return contended


def prediction_figure(
    rows: Sequence[dict[str, Any]],
    measured: Optional[Mapping[int, dict[str, Any]]] = None,
    title: str = "",
    anchors: Sequence[dict[str, Any]] = (),
) -> Any:
    """Predicted (harness.study.prediction.predict) step time and efficiency against nodes, with measured step
    times (harness.study.prediction.predict.measured_steps: by world size, mean and 95% interval; boxed in red
    if measured under contention) and published anchors (dicts with nodes, efficiency, label) on the
    same axes. Returns the Figure."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    from matplotlib.figure import Figure

    measured = measured or {}
    with rc_context(SLIDE_STYLE):
        fig = Figure(figsize=(FIGSIZE[0], FIGSIZE[1] * 1.5), layout="constrained")
        step_ax, efficiency_ax = fig.subplots(2, 1, sharex=True)
        nodes = [row["nodes"] for row in rows]
        step_ax.plot(nodes, [1e3 * row["step_s"] for row in rows], marker="o", color=PALETTE[1], label="predicted")
        efficiency_ax.plot(nodes, [row["efficiency"] for row in rows], marker="o", color=PALETTE[1], label="predicted")
        contended = _draw_measured(step_ax, efficiency_ax, rows, measured)
        for anchor in anchors:
            efficiency_ax.scatter(
                [anchor["nodes"]],
                [anchor["efficiency"]],
                marker="*",
                s=300,
                color=PALETTE[3],
                edgecolors="black",
                zorder=4,
                label=anchor["label"],
            )
        for ax in (step_ax, efficiency_ax):
            ax.set_xscale("log", base=2)
            ax.set_xticks(nodes)
            ax.set_xticklabels([str(n) for n in nodes])
            ax.minorticks_off()
        _legend(step_ax, contended)
        efficiency_ax.legend(loc="lower left")
        step_ax.set_ylabel("time per step (ms)")
        step_ax.set_ylim(bottom=0)
        efficiency_ax.set_ylabel("scaling efficiency")
        efficiency_ax.set_ylim(0, 1.1)
        efficiency_ax.set_xlabel("nodes")
        step_ax.set_title(f"Predicted vs measured\n{title}" if title else "Predicted vs measured")
    fig.harness_metadata = {
        "figure": "prediction",
        "title": step_ax.get_title(),
        "predicted": list(rows),
        "measured": {str(n): m for n, m in measured.items()},
        "anchors": list(anchors),
    }
    return fig


def write_prediction_figure(
    rows: Sequence[dict[str, Any]],
    measured: Optional[Mapping[int, dict[str, Any]]],
    title: str,
    prefix: str,
    anchors: Sequence[dict[str, Any]] = (),
) -> list[str]:
    """prediction_figure saved as PREFIX-prediction.{png,svg,json}; the paths written."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    with rc_context(SLIDE_STYLE):
        return _save(prediction_figure(rows, measured, title, anchors), f"{prefix}-prediction")
