"""Notebook 01's picture of equivalence: one bar per run on a log scale, the bound as a line."""

from __future__ import annotations

from harness.workshop import equivalence_figure


def test_the_figure_draws_each_run_and_the_bound():
    rows = [
        {"run": "ddp", "difference / update": 3.2e-6},
        {"run": "ddp, clipping at 1.0", "difference / update": 0.68},
    ]
    figure = equivalence_figure(rows, 1e-3)
    [axes] = figure.axes
    widths = [bar.get_width() for bar in axes.patches]
    assert widths == [3.2e-6, 0.68] and axes.get_xscale() == "log"
    assert [tick.get_text() for tick in axes.get_yticklabels()] == ["ddp", "ddp, clipping at 1.0"]
    assert [line.get_xdata()[0] for line in axes.get_lines()] == [1e-3]
