"""WORKSHOP.md's agenda adds up: each slot starts where the one before ended, the slots fill the
time its title promises, every notebook and every exercise step has its slot, questions and slack have
theirs, and set-up is done the day before."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

WORKSHOP = Path(REPO, "WORKSHOP.md").read_text()
HOURS = {"two": 2, "three": 3, "four": 4}


def _agenda() -> list[tuple[int, int, str]]:
    """(start minute, minutes, what) per row of the agenda table."""
    rows = re.findall(r"^\| (\d+):(\d\d) \| (\d+) min \| (.+?) \|$", WORKSHOP, re.M)
    return [(60 * int(hours) + int(minutes), int(length), what) for hours, minutes, length, what in rows]


def test_the_slots_follow_each_other_and_fill_the_promised_time():
    agenda = _agenda()
    assert agenda, "no agenda table found in WORKSHOP.md"
    for (start, length, what), (next_start, _, _) in zip(agenda, agenda[1:]):
        assert start + length == next_start, (
            f"{what!r} ends at minute {start + length}, the next slot starts at {next_start}"
        )
    promised = HOURS[re.search(r"^# .* in (\w+) hours", WORKSHOP, re.M)[1]] * 60
    assert agenda[-1][0] + agenda[-1][1] == promised, f"the agenda ends at minute {agenda[-1][0] + agenda[-1][1]}"


def test_every_notebook_and_exercise_step_has_a_slot():
    slots = " ".join(what for _, _, what in _agenda())
    for notebook in sorted(Path(REPO, "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert slots.count(f"notebook {notebook.name[:2]}") == 1, f"{notebook.name} needs one agenda slot"
    for step in sorted(Path(REPO, "solutions").glob("[0-9][0-9]_*.py")):
        if step.name != "01_serial.py":  # the serial starting point, read in step 2's slot
            assert f"`{step.name}`" in slots, f"exercise {step.name} has no agenda slot"


def test_the_day_has_question_time_and_slack_and_is_set_up_the_day_before():
    slots = [(length, what) for _, length, what in _agenda()]
    assert any(what.startswith("questions") for _, what in slots), "no agenda slot for questions"
    assert any("slack" in what for _, what in slots), "no agenda slot keeps slack for a slot that ran over"
    setup = re.search(r"^## Start JupyterLab\n(.*?)^## ", WORKSHOP, re.M | re.S)[1]
    agenda = re.search(r"^## Agenda\n(.*?)^\| time", WORKSHOP, re.M | re.S)[1]
    for where, text in (("the set-up section", setup), ("the agenda", agenda)):
        assert "the day before" in text.lower() and "make setup" in text, (
            f"{where} does not put `make setup` the day before"
        )
