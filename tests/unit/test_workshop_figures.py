"""The notebooks' figures (harness.workshop.figures, harness.study.scaling.run_plots.loss_figure): a run keeps its
colour from figure to figure when given a label -> colour mapping, and the packing figure shows
each placement's 95% interval and names its axes. Checked on the Figure objects, not on pixels."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from harness.study import loss_figure
from harness.workshop import (
    accuracy_figure,
    epoch_loss_figure,
    packing_figure,
    packing_rows,
    padded_evaluation,
    padded_evaluation_figure,
    run_colours,
)

LABELS = ["1 worker", "256, not scaled", "256, linear"]


def _record(losses: list, accuracy: float) -> dict:
    return {
        "train_losses": losses,
        "steps_per_epoch": 5,
        "eval_accuracy": accuracy,
        "train_loss": losses[-1],
        "history": {"step": list(range(1, len(losses) + 1)), "loss": losses},
    }


RECORDS = [_record([1.0, 0.5], 0.98), _record([2.0, 0.6], 0.95), _record([100.0, 2.3], 0.1)]


def test_run_colours_give_each_label_its_own_colour_in_order():
    colours = run_colours(LABELS)
    assert list(colours) == LABELS and len(set(colours.values())) == len(LABELS)
    assert run_colours(LABELS[:2]) == {label: colours[label] for label in LABELS[:2]}


def test_a_run_has_the_same_colour_in_every_figure_that_is_given_the_mapping():
    colours = run_colours(reversed(LABELS))  # not the order the figures draw them in
    steps = loss_figure(RECORDS, LABELS, colours=colours).axes[0]
    epochs = epoch_loss_figure(RECORDS, LABELS, colours=colours).axes[0]
    bars = accuracy_figure(RECORDS, LABELS, colours=colours).axes[0]
    for index, label in enumerate(LABELS):
        assert to_hex(steps.lines[index].get_color()) == colours[label]
        assert to_hex(epochs.lines[index].get_color()) == colours[label]
        assert to_hex(bars.patches[index].get_facecolor()) == colours[label]


def _packing_record(world_size: int, throughput: float) -> dict:
    return {
        "world_size": world_size,
        "throughput": throughput,
        "threads_per_rank": 2 // world_size,
        "device": "cpu",
        "tags": {"ranks_per_device": str(world_size), "mps": "off"},
        "step_breakdown": {"seconds_per_step": {"forward_backward": 0.03 / world_size, "communication": 0.01}},
    }


def test_the_packing_figure_has_error_bars_and_titled_axes():
    runs = [(1, 100), (2, 300), (1, 120), (2, 280), (1, 110), (2, 310)]
    rows = packing_rows([_packing_record(ranks, throughput) for ranks, throughput in runs])
    ax, breakdown = packing_figure(rows).axes
    assert ax.get_xlabel().startswith("ranks x torch threads") and "samples/s" in ax.get_ylabel()
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1 rank(s) x 2 thread(s)", "2 rank(s) x 1 thread(s)"]
    (errorbars,) = [container for container in ax.containers if isinstance(container, ErrorbarContainer)]
    low, high = errorbars.lines[2][0].get_segments()[0][:, 1]  # the first placement's error bar
    assert (low, high) == pytest.approx(rows[0]["interval"])
    assert "95% interval" in ax.get_title()
    # The second panel stacks a rank's phases: forward + backward, then communication on top of it.
    assert "ms" in breakdown.get_ylabel() and "forward + backward" in [
        t.get_text() for t in breakdown.get_legend().texts
    ]
    tops = {patch.get_x(): patch.get_y() + patch.get_height() for patch in breakdown.patches if patch.get_height()}
    assert sorted(tops.values()) == pytest.approx([25.0, 40.0])  # 2 ranks: 15 + 10 ms; 1 rank: 30 + 10 ms


def test_the_padded_evaluation_figure_does_not_magnify_a_shift_below_the_test_sets_standard_error():
    correct = np.arange(297) % 20 != 0  # 95% right, as the workshop CNN is
    evaluations = [padded_evaluation(correct, world) for world in (1, 2, 8, 32, 128)]
    ax = padded_evaluation_figure(evaluations).axes[0]
    error = 100 * evaluations[0].standard_error
    assert error == pytest.approx(100 * (0.95 * 0.05 / 297) ** 0.5, rel=0.01)
    low, high = ax.get_ylim()
    assert low <= -2.5 * error and high >= 2.5 * error  # the axis spans the test set's own noise
    (shifts,) = [line for line in ax.lines if line.get_marker() == "o"]
    assert list(shifts.get_ydata()) == pytest.approx([100 * e.accuracy_error for e in evaluations])
