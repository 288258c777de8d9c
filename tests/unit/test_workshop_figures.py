"""The notebooks' figures (harness.workshop.figures, harness.study.plot.loss_figure): a run keeps its
colour from figure to figure when given a label -> colour mapping, and the packing figure shows
each placement's 95% interval and names its axes. Checked on the Figure objects, not on pixels."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex
from matplotlib.container import ErrorbarContainer

from harness.study import loss_figure
from harness.workshop import accuracy_figure, epoch_loss_figure, packing_figure, packing_rows, run_colours

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
    }


def test_the_packing_figure_has_error_bars_and_titled_axes():
    runs = [(1, 100), (2, 300), (1, 120), (2, 280), (1, 110), (2, 310)]
    rows = packing_rows([_packing_record(ranks, throughput) for ranks, throughput in runs])
    ax = packing_figure(rows).axes[0]
    assert ax.get_xlabel().startswith("placement") and "samples/s" in ax.get_ylabel()
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["1 rank(s) x 2 thread(s)", "2 rank(s) x 1 thread(s)"]
    (errorbars,) = [container for container in ax.containers if isinstance(container, ErrorbarContainer)]
    low, high = errorbars.lines[2][0].get_segments()[0][:, 1]  # the first placement's error bar
    assert (low + high) / 2 == pytest.approx(rows[0]["samples/s"]) and high - low == pytest.approx(2 * rows[0]["ci95"])
    assert "95% interval" in ax.get_title()
