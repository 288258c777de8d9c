"""Figures the workshop notebooks draw besides the scaling ones (harness.study.scaling.plot), in the same slide
style: large text, labelled axes with units, matplotlib Figure objects without pyplot state (a
notebook displays one by evaluating it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from ..data.sharding import dropped_tail, epoch_permutation, rank_slice, steps_per_epoch
from ..errors import require
from ..study.scaling.plot import FIGSIZE, PALETTE, PHASE_STYLE, PLOT_INSTALL, SLIDE_STYLE
from ..training.metrics import AU_FORMULA


def _figure(size: Any = FIGSIZE) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=size, layout="constrained")


def run_colours(labels: Iterable[str]) -> dict[str, str]:
    """One colour per run label, in order (the palette's grey left for reference lines): pass the
    same mapping to every figure of a notebook so that a run keeps its colour from one to the next."""
    return {label: PALETTE[1 + i % (len(PALETTE) - 1)] for i, label in enumerate(labels)}


def accuracy_figure(
    records: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    chance: float = 0.1,
    title: str = "Final test accuracy",
    colours: Optional[Mapping[str, str]] = None,
) -> Any:
    """Each run's final eval accuracy (%) as a labelled bar, with the accuracy of guessing dashed.
    `colours`: label -> colour (run_colours), so that each run looks as in the notebook's other figures."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    colours = colours or run_colours(labels)
    with rc_context(SLIDE_STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        values = [100 * record["eval_accuracy"] for record in records]
        bars = ax.barh(range(len(values)), values, color=[colours[label] for label in labels])
        ax.bar_label(bars, labels=[f"{value:.1f}%" for value in values], padding=4)
        ax.axvline(100 * chance, color="black", linestyle="--", linewidth=1.6, label=f"guessing ({100 * chance:.0f}%)")
        ax.set_yticks(range(len(values)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_xlim(0, 112)
        ax.set_xlabel("test accuracy (%, every test sample once)")
        ax.set_title(title)
        ax.grid(False, axis="y")
        ax.legend(loc="lower right")
    return fig


def equivalence_figure(rows: Sequence[Mapping[str, Any]], bound: float) -> Any:
    """Each run's distance from the one-process weights relative to the update (the rows of
    harness.study.compare_with_reference), as horizontal bars on a log scale, with `bound` dashed."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    labels = [row["run"] for row in rows]
    values = [row["difference / update"] for row in rows]
    colours = run_colours(labels)
    with rc_context(SLIDE_STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        bars = ax.barh(range(len(values)), values, color=[colours[label] for label in labels])
        ax.bar_label(bars, labels=[f"{value:.1e}" for value in values], padding=4)
        ax.axvline(bound, color="black", linestyle="--", linewidth=1.6, label=f"comparison bound ({bound:g})")
        ax.set_xscale("log")
        ax.set_xlim(min(values) / 10, max(max(values), bound) * 30)
        ax.set_yticks(range(len(values)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_xlabel("|w - w one process| / |w one process - w start| (worst tensor)")
        ax.set_title("Final weights against one process on the whole global batch")
        ax.grid(False, axis="y")
        ax.legend(loc="upper right")
    return fig


def epoch_loss_figure(
    records: Sequence[Mapping[str, Any]],
    labels: Sequence[str],
    title: str = "Training loss per epoch",
    colours: Optional[Mapping[str, str]] = None,
) -> Any:
    """Each run's training loss per epoch (the record's `train_losses`: the mean over every sample
    of the epoch) against the epoch, on a log scale: runs with different batches compared after
    the same passes over the training set (each drops its own tail of fewer than one batch, so a
    larger batch trains a few samples fewer per epoch). `colours`: label -> colour (run_colours)."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    colours = colours or run_colours(labels)
    with rc_context(SLIDE_STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        for record, label in zip(records, labels):
            losses = record["train_losses"]
            ax.plot(
                range(1, len(losses) + 1),
                losses,
                marker="o",
                color=colours[label],
                label=f"{label} ({record['steps_per_epoch']} steps/epoch)",
            )
        ax.set_yscale("log")
        _plain_log_labels(ax, [loss for record in records for loss in record["train_losses"]])
        ax.set_xticks(range(1, max(len(record["train_losses"]) for record in records) + 1))
        ax.set_xlabel("epoch (one pass over the training set, less each batch size's dropped tail)")
        ax.set_ylabel("training loss (mean over the epoch)")
        ax.set_title(title)
        ax.legend(loc="best")
    return fig


def seeds_figure(
    runs: Mapping[str, Mapping[int, Mapping[str, Any]]],
    title: str = "Training loss after the last epoch, per seed",
    colours: Optional[Mapping[str, str]] = None,
) -> Any:
    """Each run's final training loss (`train_loss`) at every seed as a dot, on a log scale, with the
    geometric mean over the seeds and its 95% interval (harness.study.scaling.intervals.mean_interval;
    none below 3 seeds) as a bar: `runs` is label -> seed -> record. `colours`: label -> colour."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    from ..study.scaling.intervals import error_bars, geometric_mean, mean_interval

    labels = list(runs)
    colours = colours or run_colours(labels)
    losses = [[float(record["train_loss"]) for record in runs[label].values()] for label in labels]
    centres = [geometric_mean(values) for values in losses]
    with rc_context(SLIDE_STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        below, above = error_bars(centres, [mean_interval(values) for values in losses])
        for row, (label, values) in enumerate(zip(labels, losses)):
            bar = [[below[row]], [above[row]]]
            ax.errorbar(centres[row], row, xerr=bar, fmt="|", markersize=22, capsize=8, color=colours[label])
            ax.scatter(values, [row] * len(values), s=90, color=colours[label], edgecolor="black", zorder=3)
        ax.set_xscale("log")
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        ax.set_xlabel("training loss over the last epoch (dots: seeds; bar: mean and its 95% interval)")
        ax.set_title(title)
        ax.grid(False, axis="y")
    return fig


def _plain_log_labels(ax: Any, values: Sequence[float]) -> None:
    """Log-axis labels as plain numbers (0.4, 2) rather than 4x10^-1; within one decade the
    labelled ticks are minor ones, so those get plain labels too."""
    from matplotlib.ticker import FuncFormatter

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    if max(values) < 10 * min(values):
        ax.yaxis.set_minor_formatter(plain)


def sharding_figure(
    num_samples: int, global_batch: int, world_sizes: Sequence[int], seed: int = 0, epoch: int = 0
) -> Any:
    """One epoch of harness sharding at several world sizes with the same global batch: each row is
    one world size, each cell a position in the epoch's order labelled with the sample it holds,
    coloured by the rank that trains it; thick lines separate steps (global batches); grey cells are
    the dropped tail (fewer than one global batch)."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    from matplotlib.patches import Patch, Rectangle

    order = epoch_permutation(num_samples, seed, epoch)
    steps = steps_per_epoch(num_samples, 1, global_batch)
    tail = set(dropped_tail(num_samples, 1, global_batch, seed, epoch).tolist())
    with rc_context({**SLIDE_STYLE, "axes.grid": False}):
        fig = _figure((max(10, 0.55 * num_samples), 1.9 + 1.1 * len(world_sizes)))
        ax = fig.add_subplot()
        for row, world in enumerate(world_sizes):
            local = global_batch // world
            owner = {}
            for step in range(steps):
                for rank in range(world):
                    for sample in rank_slice(order, step, world, rank, local):
                        owner[int(sample)] = rank
            for position, sample in enumerate(order.tolist()):
                colour = "#d9d9d9" if sample in tail else PALETTE[1 + owner[sample] % (len(PALETTE) - 1)]
                ax.add_patch(Rectangle((position, row), 1, 0.8, facecolor=colour, edgecolor="white"))
                ax.text(position + 0.5, row + 0.4, str(sample), ha="center", va="center", fontsize=10)
            for step in range(1, steps + 1):
                ax.plot([step * global_batch] * 2, [row - 0.1, row + 0.9], color="black", linewidth=2.5)
        ax.set_xlim(0, num_samples)
        ax.set_ylim(len(world_sizes) - 0.1, -0.2)
        ax.set_yticks([row + 0.4 for row in range(len(world_sizes))])
        ax.set_yticklabels([f"{world} rank(s)\n{global_batch // world} per rank" for world in world_sizes])
        ax.set_xlabel(
            f"position in epoch {epoch}'s order (sample id in each cell); "
            f"black lines end each global batch of {global_batch}"
        )
        ax.set_xticks([])
        ranks = max(world_sizes)
        handles = [Patch(color=PALETTE[1 + rank % (len(PALETTE) - 1)], label=f"rank {rank}") for rank in range(ranks)]
        handles.append(Patch(color="#d9d9d9", label="dropped this epoch"))
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=min(len(handles), 5))
        ax.set_title(f"Sharding of {num_samples} samples, global batch {global_batch} (seed {seed})")
    return fig


def padded_evaluation_figure(evaluations: Sequence[Any]) -> Any:
    """What a DistributedSampler evaluation reports minus the exact accuracy (accuracy points)
    against world size, inside a band of +-1 and +-2 standard errors of the exact accuracy over
    this test set (the axis spans at least +-2.5 of them, so that no shift looks larger than the
    test set can tell), with the duplicates counted on a second axis
    (harness.workshop.pipeline.PaddedEvaluation items)."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    worlds = [e.world_size for e in evaluations]
    shifts = [100 * e.accuracy_error for e in evaluations]
    error = 100 * evaluations[0].standard_error
    with rc_context(SLIDE_STYLE):
        fig = _figure()
        ax = fig.add_subplot()
        for width, alpha in ((2, 0.12), (1, 0.22)):
            ax.axhspan(-width * error, width * error, color=PALETTE[1], alpha=alpha, linewidth=0)
        ax.axhline(0, color=PALETTE[1], linestyle="--", label="harness (every sample once): no shift")
        ax.plot(worlds, shifts, marker="o", color=PALETTE[3], label="DistributedSampler (padded) minus exact")
        ax.set_xscale("log", base=2)
        ax.set_xticks(worlds)
        ax.set_xticklabels([str(w) for w in worlds])
        ax.minorticks_off()
        ax.set_xlabel("ranks evaluating")
        ax.set_ylabel("accuracy reported minus exact (points)")
        reach = max(2.5 * error, 1.2 * max(abs(shift) for shift in shifts))
        ax.set_ylim(-reach, reach)
        twin = ax.twinx()
        twin.bar(
            worlds,
            [e.duplicates for e in evaluations],
            width=[w * 0.35 for w in worlds],
            alpha=0.3,
            color="grey",
            label="samples counted twice",
        )
        twin.set_ylabel("samples counted twice")
        twin.grid(False)
        ax.set_zorder(twin.get_zorder() + 1)
        ax.patch.set_visible(False)
        lines, names = ax.get_legend_handles_labels()
        bars, bar_names = twin.get_legend_handles_labels()
        ax.legend(lines + bars, names + bar_names, loc="lower left")
        ax.set_title(
            f"The same model on {evaluations[0].test_samples} test samples by N ranks\n"
            f"shaded: 1 and 2 standard errors of the exact accuracy ({error:.2f} points)"
        )
    return fig


def loading_figure(measurements: Sequence[Any]) -> Any:
    """Throughput (samples/s) and AU of each loading configuration side by side
    (harness.workshop.pipeline.LoadingMeasurement items)."""
    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context

    labels = [
        f"{m.source}\n{m.num_workers} worker(s)" + (f", prefetch {m.prefetch}" if m.num_workers else "")
        for m in measurements
    ]
    colours = {"per-sample": PALETTE[3], "prepared": PALETTE[1]}
    with rc_context(SLIDE_STYLE):
        fig = _figure((FIGSIZE[0] + 4, FIGSIZE[1]))
        left, right = fig.subplots(1, 2)
        positions = np.arange(len(measurements))
        for ax, values, label in (
            (left, [m.throughput for m in measurements], "training throughput (samples/s)"),
            (right, [m.au for m in measurements], AU_FORMULA),
        ):
            bars = ax.barh(positions, values, color=[colours[m.source] for m in measurements])
            ax.bar_label(bars, labels=[f"{v:,.0f}" if v > 2 else f"{v:.2f}" for v in values], padding=3)
            ax.set_yticks(positions)
            ax.set_yticklabels(labels if ax is left else [])
            ax.invert_yaxis()
            ax.set_xlabel(label)
            ax.grid(False, axis="y")
            ax.set_xlim(0, max(values) * 1.25)
        right.set_xlim(0, 1.15)
        fig.suptitle("Per-sample image decoding vs prepared arrays, same model and loop")
    return fig


def packing_figure(rows: Sequence[dict[str, Any]], title: str = "Several ranks per device") -> Any:
    """Per placement (harness.workshop.packing.packing_rows), left: the throughput's mean over
    repeats with its 95% interval as an error bar and the speedup over the first placement written
    on each bar; right: one rank's milliseconds per step in each phase, stacked."""
    from ..study.scaling.intervals import error_bars

    rc_context = require("matplotlib", "plotting", PLOT_INSTALL).rc_context
    on_gpus = rows[0]["device"] == "cuda"
    labels = [row["placement"].replace(" (", "\n(") for row in rows]
    means = [row["samples/s"] for row in rows]
    below, above = error_bars(means, [row["interval"] for row in rows])
    with rc_context(SLIDE_STYLE):
        fig = _figure((14, 6))
        ax, right = fig.subplots(1, 2)
        ax.bar(range(len(rows)), means, color=PALETTE[1], width=0.6, yerr=[below, above], capsize=10)
        for x, (row, top) in enumerate(zip(rows, above)):  # above the error bar, not on it
            ax.annotate(
                f"{row['samples/s']:,.0f}\n(x{row['speedup']:.2f})",
                (x, row["samples/s"] + top),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
            )
        ax.set_ylabel("throughput (samples/s, all ranks)")
        ax.set_ylim(0, max(mean + top for mean, top in zip(means, above)) * 1.35)
        runs = min(row["runs"] for row in rows)
        ax.set_title(f"mean of {runs} interleaved repeats, error bars: 95% interval" if runs > 1 else "one run each")
        _breakdown_bars(right, rows)
        for axes in (ax, right):
            axes.set_xticks(range(len(rows)))
            axes.set_xticklabels(labels)
            axes.grid(False, axis="x")
            axes.set_xlabel("ranks per GPU (MPS shares each GPU)" if on_gpus else "ranks x torch threads, pinned")
        fig.suptitle(title)
    return fig


def _breakdown_bars(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    """One rank's mean milliseconds per step in each phase, stacked per placement."""
    bottoms = np.zeros(len(rows))
    for phase in ("forward_backward", "optimizer", "communication", "data_wait", "other"):
        heights = np.array([row["per step ms"].get(phase, 0.0) for row in rows])
        name, colour = PHASE_STYLE[phase]
        ax.bar(range(len(rows)), heights, bottom=bottoms, width=0.6, color=colour, label=name)
        bottoms += heights
    ax.set_ylabel("one rank's time per step (ms)")
    ax.set_title("where a rank's step goes (mean of the repeats)")
    ax.legend(loc="upper left", fontsize="small")
    ax.set_ylim(0, max(bottoms) * 1.4 if len(bottoms) and max(bottoms) > 0 else 1)
