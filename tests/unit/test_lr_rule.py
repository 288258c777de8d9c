"""One learning-rate rule, taught the same way everywhere: harness.workshop.checker.lr.RULE, word for word, in
notebook 02, the TODO(lr) hint of every step and step 5's text (solutions and generated exercises), the
check's messages, WORKSHOP.md's notebook 02 questions and the docs pages that state the rule; and the check
accepts exactly the rules notebook 02's committed run could not reject (its cell that prints them).

Read from the files as committed: nothing is trained. The check's LR judgement runs on stand-in records.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import ErrorbarContainer

from harness import workshop
from harness.training.lr import learning_rate
from harness.workshop import accepted_rules, compare, seeds_figure, verdict
from harness.workshop.checker.lr import ACCEPTED, RULE, check_lr, lr_rules, rule_text
from tests.conftest import REPO

NOTEBOOK = Path(REPO, "notebooks", "02_lr_scaling_and_warmup.ipynb")
SOLUTIONS = sorted(Path(REPO, "solutions").glob("[0-9][0-9]_*.py"))
DOCS = ("docs/concepts/equivalence.md", "docs/tutorials/exercises.md", "docs/tutorials/workshop.md")
ACCEPTS = re.compile(r"^(adam|sgd), (with|without) warmup: harness check accepts (.+)$", re.M)


def _flat(text: str) -> str:
    """Prose as read: comment marks, markdown emphasis and line breaks left out, whitespace collapsed."""
    text = re.sub(r"^\s*# ?", "", text, flags=re.M)
    return " ".join(text.replace("*", "").split())


def _notebook_cells() -> list[dict]:
    return json.loads(NOTEBOOK.read_text())["cells"]


def _hint(text: str, title: str) -> Optional[str]:
    """The comment lines after the line that opens the TODO titled `title` (a solution's `# TODO(key): title`,
    an exercise's `# TODO N: title`), or None where there is none."""
    lines = text.splitlines()
    heading = re.compile(rf"\s*# (?:TODO[^:]*: )?{re.escape(title)}$", re.I)  # kept as code: "# Title"
    opening = next((i for i, line in enumerate(lines) if heading.match(line)), None)
    if opening is None:
        return None
    hint = []
    for line in lines[opening + 1 :]:
        if not line.lstrip().startswith("#") or "END TODO" in line:
            break
        hint.append(line)
    return "\n".join(hint)


def _places() -> dict[str, str]:
    """Every place that must state the rule -> its text."""
    places = {
        "notebook 02": "\n".join("".join(c["source"]) for c in _notebook_cells() if c["cell_type"] == "markdown"),
        "WORKSHOP.md": re.search(
            r"^### Notebook 02\b.*?(?=^### |\Z)", Path(REPO, "WORKSHOP.md").read_text(), re.M | re.S
        )[0],
        "the check's message": rule_text({"class": "SGD"}, 2, 0.025, False),
        "step 5's text": Path(REPO, "solutions", "05_warmup.py").read_text().split("# %%\n")[0],
        **{page: Path(REPO, page).read_text() for page in DOCS},
    }
    for solution in SOLUTIONS:
        text = solution.read_text()
        block = next((block for block in workshop.todo_blocks(text) if block.key == "lr"), None)
        if block is not None:
            places[f"TODO(lr) of {solution.name}"] = _hint(text, block.title) or ""
            exercise = Path(REPO, "exercises", solution.name).read_text()
            places[f"TODO(lr) of exercises/{solution.name}"] = _hint(exercise, block.title) or ""
    return places


def test_the_steps_that_scale_the_lr_include_exercises_02_and_05():
    assert {"TODO(lr) of 02_ddp.py", "TODO(lr) of 05_warmup.py", "TODO(lr) of exercises/05_warmup.py"} <= set(
        _places()
    )


@pytest.mark.parametrize("place", sorted(_places()))
def test_each_place_states_the_rule_in_its_words(place):
    assert _flat(RULE) in _flat(_places()[place]), f"{place} does not state the rule: {RULE!r}"


def test_the_check_catches_a_place_that_words_the_rule_otherwise():
    assert _flat(RULE) not in _flat(RULE.replace("square root", "square-root"))
    wrapped = "# " + RULE.replace(" by the", "\n# by the", 1)  # over two comment lines
    assert "\n" in wrapped and _flat(RULE) in _flat(wrapped)


def _printed_accepted() -> dict[tuple[str, bool], tuple[str, ...]]:
    """What notebook 02's committed run printed that the check accepts, from the one cell that prints it."""
    outputs = [
        "".join(output.get("text", ""))
        for cell in _notebook_cells()
        if cell["cell_type"] == "code" and "accepted_rules(" in "".join(cell["source"])
        for output in cell.get("outputs", [])
    ]
    assert len(outputs) == 1, "notebook 02 has no single cell that prints what harness check accepts"
    found = {
        (optimizer, warmup == "with"): tuple(rules.split(", "))
        for optimizer, warmup, rules in ACCEPTS.findall(outputs[0])
    }
    assert set(found) == set(ACCEPTED), outputs[0]
    return found


def test_the_check_accepts_what_notebook_02_could_not_reject():
    printed = _printed_accepted()
    for (optimizer, warms_up), rules in printed.items():
        spec = {"class": "Adam" if optimizer == "adam" else "SGD"}
        assert lr_rules(spec, warms_up) == rules, (optimizer, warms_up)
        assert rules[0] == "sqrt"  # the rule's own first: its failure is the one reported
    assert lr_rules({"class": "AdamW"}, False) == printed["adam", False]
    assert lr_rules(None, True) == printed["sgd", True]


# --- the check's LR judgement, on stand-in records -------------------------------------------

RANKS, BASE, STEPS, PER_EPOCH = 2, 0.025, 10, 5


def _observations(lrs: list[float], optimizer: str, warmup_epochs: float = 0.0) -> list[SimpleNamespace]:
    fetches = [("train", step // PER_EPOCH, step, []) for step in range(STEPS)]
    return [
        SimpleNamespace(
            rank=rank,
            args={"lr": BASE, "warmup_epochs": warmup_epochs},
            optimizer={"class": optimizer},
            steps=[(lr,) for lr in lrs],
            fetches=fetches,
        )
        for rank in range(RANKS)
    ]


def _ramp(peak: float, warmup_steps: int, counted_from: int = 0) -> list[float]:
    return [
        learning_rate(
            step + counted_from,
            base_lr=BASE,
            peak_lr=peak,
            warmup_steps=warmup_steps,
            total_steps=STEPS,
            schedule="constant",
        )
        for step in range(STEPS)
    ]


@pytest.mark.parametrize(
    "optimizer, factor, passes",
    [
        ("SGD", RANKS**0.5, True),
        ("SGD", 1.0, True),
        ("SGD", RANKS, True),
        ("SGD", 1 / RANKS, False),
        ("Adam", RANKS**0.5, True),
        ("Adam", RANKS, ACCEPTED["adam", False].count("linear") == 1),
        ("Adam", 1.0, ACCEPTED["adam", False].count("none") == 1),
    ],
)
def test_a_constant_lr_passes_by_an_accepted_rule_only(optimizer, factor, passes):
    failures = check_lr(_observations([BASE * factor] * STEPS, optimizer), RANKS)
    assert (failures == []) == passes, failures
    if not passes:
        assert failures[0].keys == ("lr",) and _flat(RULE) in _flat(failures[0].observed)
        assert "--lr x sqrt(2) = 0.03536, from the first step" in failures[0].observed


def test_a_warmup_climbs_to_an_accepted_rule_from_lr_at_step_0():
    root = BASE * RANKS**0.5
    assert check_lr(_observations(_ramp(root, PER_EPOCH), "Adam", 1.0), RANKS) == []
    linear = check_lr(_observations(_ramp(BASE * RANKS, PER_EPOCH), "SGD", 1.0), RANKS)
    assert linear == [] if "linear" in ACCEPTED["sgd", True] else linear
    late = check_lr(_observations(_ramp(root, PER_EPOCH, counted_from=1), "SGD", 1.0), RANKS)
    assert [failure.keys for failure in late] == [("warmup",)], late
    assert "0.03536 at step 6 (5 steps later), then stay there: step 1 trains at 0.025" in late[0].observed


def test_a_warmup_to_the_linear_lr_reports_the_ramp_it_missed():
    """A ramp that ends at an accepted rule's LR but climbs wrongly is named as a warmup mistake of that rule."""
    late = check_lr(_observations(_ramp(BASE * RANKS, PER_EPOCH, counted_from=1), "SGD", 1.0), RANKS)
    if "linear" in ACCEPTED["sgd", True]:
        assert [failure.keys for failure in late] == [("warmup",)] and "0.05 at step 6" in late[0].observed


def test_the_message_names_the_rule_and_what_else_the_check_accepts():
    sgd = rule_text({"class": "SGD"}, 2, BASE, warms_up=True)
    assert sgd.startswith(f"notebook 02's rule: {RULE} (--lr x sqrt(2) = 0.03536, reached by the warmup)")
    for rule, words in (("none", "no scaling (--lr 0.025)"), ("linear", "the linear rule (--lr x 2 = 0.05)")):
        assert (words in sgd) == (rule in ACCEPTED["sgd", True]), sgd
    adam = rule_text({"class": "Adam"}, 2, BASE, warms_up=False)
    assert adam.endswith("for Adam its runs rejected the other rules") == (ACCEPTED["adam", False] == ("sqrt",))


# --- what the notebook's seeds resolve --------------------------------------------------------


def _runs(losses: list[float]) -> dict[int, dict]:
    return {seed: {"train_loss": loss} for seed, loss in enumerate(losses)}


def test_a_verdict_is_claimed_only_where_the_interval_excludes_1():
    rule = _runs([0.14, 0.15, 0.17])
    assert verdict(compare(_runs([2.3, 2.3, 2.3]), rule)) == "higher"
    assert verdict(compare(_runs([0.41, 0.37, 2.3]), rule)) == "not resolved"  # one bad seed of three
    assert verdict(compare(_runs([0.05, 0.06, 0.05]), rule)) == "lower"
    assert compare(_runs([0.4, 0.3]), _runs([0.1, 0.1])) is None and verdict(None) == "not resolved"


def test_accepted_rules_leave_out_what_was_resolved_worse_and_count_no_scaling_for_both():
    variants = {
        "none": {"lr_scaling": "none"},
        "sqrt": {"lr_scaling": "sqrt"},
        "sqrt+w": {"lr_scaling": "sqrt", "warmup_epochs": 1},
        "linear": {"lr_scaling": "linear"},
        "linear+w": {"lr_scaling": "linear", "warmup_epochs": 1},
    }
    verdicts = {
        "sqrt+w": "the rule",
        "none": "not resolved",
        "sqrt": "higher",
        "linear": "higher",
        "linear+w": "not resolved",
    }
    assert accepted_rules(variants, verdicts) == {False: ["none"], True: ["sqrt", "none", "linear"]}


def test_the_seeds_figure_shows_every_seed_and_an_interval_per_run():
    runs = {"rule": _runs([0.14, 0.15, 0.17]), "two seeds": _runs([0.4, 0.3])}
    ax = seeds_figure(runs).axes[0]
    dots = sorted(len(points.get_offsets()) for points in ax.collections if isinstance(points, PathCollection))
    bars = [container for container in ax.containers if isinstance(container, ErrorbarContainer)]  # a mean each
    assert dots == [2, 3] and len(bars) == 2, (dots, bars)
    assert [label.get_text() for label in ax.get_yticklabels()] == list(runs)
