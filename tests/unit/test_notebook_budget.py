"""The workshop's notebooks as committed: each shows a figure, each ran within the time its **Time:**
line states (the agenda's slots rest on it), and together they ran within the 15 minutes the notebook
tier may take (their cells' own execution times, as the idle run that committed them recorded;
tests/notebooks runs them again under nbval)."""

from __future__ import annotations

import datetime
import glob
import json
import os

from tests.conftest import REPO
from tests.unit.test_workshop_numbers import _stated_minutes

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "[0-9][0-9]_*.ipynb")))
BUDGET_S = 15 * 60  # seven notebooks: 14.3 minutes in the idle run that committed them
ABOUT = 1.5  # "about 2 minutes to run": the idle run that committed the outputs took at most half as long again


def _code_cells(path: str) -> list[dict]:
    with open(path) as handle:
        return [cell for cell in json.load(handle)["cells"] if cell["cell_type"] == "code"]


def _instant(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seconds(path: str) -> float:
    """From the first cell's start to the last cell's end, as the committed run recorded them."""
    times = [cell["metadata"].get("execution", {}) for cell in _code_cells(path)]
    assert all("iopub.execute_input" in t and "iopub.status.idle" in t for t in times), f"{path}: a cell never ran"
    starts = [_instant(t["iopub.execute_input"]) for t in times]
    ends = [_instant(t["iopub.status.idle"]) for t in times]
    return (max(ends) - min(starts)).total_seconds()


def test_every_notebook_shows_a_figure():
    assert len(NOTEBOOKS) >= 6
    without = [
        os.path.basename(path)
        for path in NOTEBOOKS
        if not any("image/png" in output.get("data", {}) for cell in _code_cells(path) for output in cell["outputs"])
    ]
    assert without == [], f"notebooks with no figure among their outputs: {without}"


def test_the_notebooks_ran_within_their_budget_together():
    seconds = {os.path.basename(path): _seconds(path) for path in NOTEBOOKS}
    assert sum(seconds.values()) < BUDGET_S, seconds


def test_each_notebook_ran_within_the_time_it_states():
    for path in NOTEBOOKS:
        minutes = _stated_minutes(os.path.basename(path)[:2])[0]
        assert _seconds(path) <= ABOUT * 60 * minutes, (
            f"{os.path.basename(path)} ran {_seconds(path):.0f} s; its **Time:** line says {minutes} minute(s) to run"
        )
