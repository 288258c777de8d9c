"""Every number WORKSHOP.md states is one the material shows: a notebook's committed outputs, its code
or its stated time, an arithmetic identity written out in the same paragraph, or the code the text
names. Each notebook has its questions; it states a reading time its words need, and its agenda slot
holds its run, its reading and the minute WORKSHOP.md allows for the first imports.

Read from the notebooks' JSON as committed: nothing is executed. Numbers inside code spans and code
blocks are commands and names shown verbatim, not claims, and are left to the tests of those commands.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO

WORKSHOP_LINES = Path(REPO, "WORKSHOP.md").read_text().splitlines()
NOTEBOOKS = {path.name[:2]: path for path in sorted(Path(REPO, "notebooks").glob("[0-9][0-9]_*.ipynb"))}
STEPS = {path.name[:2]: path for path in sorted(Path(REPO, "solutions").glob("[0-9][0-9]_*.py"))}
# What `make setup` and `make lab` run: the setup section's numbers (the lab's port) come from there.
SETUP_CODE = ("Makefile", "tools/setup.sh", "tools/lab.sh")

# Numbers that are not measurements and that no output could show, each with its reason:
# (a piece of the line that holds it, the number).
NOT_MEASUREMENTS = {
    # The question's premise (a hypothetical packing); the answer's "4 times" is checked against it.
    ("You pack 4 ranks per GPU", "4"),
    # A wrong result the question asks the reader to diagnose, not one the notebook measured.
    ("A weak-scaling efficiency of 2.8", "2.8"),
}

# A number on its own: not part of a name such as fp16, int64 or nid001234, nor of a clock time (the
# agenda's, checked by test_workshop_agenda.py); 2^N is one number.
NUMBER = re.compile(r"(?<![\w.:^/-])(2\^\d+|\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?)(?![\w:]|\.\d)(%?)")
ANY_NUMBER = re.compile(r"2\^\d+|\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
TIMES = re.compile(r"^\s*(?:times|-fold)\b")
REFERENCE = re.compile(r"\b(notebook|step|section)s? (\d+)(?: or (\d+))?(?:, (\d+) or (\d+))?", re.I)
# Technical prose read closely, with its code and outputs beside it: words per minute.
READING_WORDS_PER_MINUTE = 120
# WORKSHOP.md's agenda: "a minute more for the first imports and the engines starting".
START_MINUTES = 1
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(token: str) -> float:
    if token.startswith("2^"):
        return float(2 ** int(token[2:]))
    return float(token.replace(",", ""))


def _tolerance(token: str) -> float:
    """Half a unit in the last place the token writes: "20" stands for 19.5 to 20.5."""
    if token.startswith("2^"):
        return 0.0
    mantissa, _, exponent = token.replace(",", "").partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals) * (1 + 1e-9)


def _numbers(text: str) -> list[float]:
    return [_value(token) for token in ANY_NUMBER.findall(text)]


@cache
def _cells(key: str) -> tuple[str, str, str]:
    """(outputs, code, stated time) of notebook `key`, from its committed JSON."""
    outputs, code, time = [], [], []
    for cell in json.loads(NOTEBOOKS[key].read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            time += re.findall(r"\*\*Time:\*\*(.*?)(?:\n\n|$)", source, re.S)
            continue
        code.append(source)
        for output in cell.get("outputs", []):
            outputs.append("".join(output.get("text", "")))
            outputs.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(outputs), "\n".join(code), "\n".join(time)


@cache
def _headings(key: str) -> set[str]:
    cells = json.loads(NOTEBOOKS[key].read_text())["cells"]
    sources = ("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
    return {number for source in sources for number in re.findall(r"^#+ (\d+)\.", source, re.M)}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "sqrt":
        return math.sqrt(_evaluate(node.args[0]))
    raise ValueError("not arithmetic")


def _identities(paragraph: str) -> set[str]:
    """The numbers of every `a × b − c = d` written in the paragraph that holds."""
    held = set()
    for left, right in re.findall(r"([√\d.,\s×−+/()]*\d)\s*=\s*(\d[\d,]*(?:\.\d+)?)", paragraph):
        python = re.sub(r"√(\d+)", r"sqrt(\1)", left.replace("×", "*").replace("−", "-").replace(",", ""))
        try:
            value = _evaluate(ast.parse(python.strip(), mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError):
            continue
        if abs(value - _value(right)) <= _tolerance(right):
            held.update(ANY_NUMBER.findall(left) + [right])
    return held


def _is_ratio(token: str, paragraph: str) -> bool:
    """A number followed by "times": it is the quotient of two numbers the paragraph states."""
    values = [value for value in _numbers(paragraph) if value > 0]
    return any(abs(a / b - _value(token)) <= _tolerance(token) for a in values for b in values)


def _sections() -> list[tuple[int, str, list[str]]]:
    """(line number, paragraph, the notebooks it is about) per paragraph, code blocks left out; a
    question and its answer are one paragraph."""
    paragraphs, section, fenced, answering, lines, start = [], [], False, False, [], 0
    for number, line in enumerate(WORKSHOP_LINES + [""], start=1):
        fenced ^= line.startswith("```")
        answering = (answering or line.startswith("<details>")) and not line.startswith("</details>")
        if line.startswith("```") or fenced:
            continue
        if heading := re.match(r"#{2,3} (?:Notebook (\d\d))?", line):
            section = [heading[1]] if heading[1] else [] if line.startswith("## ") else section
        if (line.strip() or answering) and not line.startswith("#"):
            lines.append(line)
            start = start or number
            continue
        if lines:
            paragraphs.append((start, "\n".join(lines), section))
        lines, start = [], 0
    return paragraphs


def _sources(paragraph: str, notebooks: list[str], line: int) -> str:
    """The text a paragraph's numbers must come from: its notebooks' (or the notebooks its agenda row
    names) outputs, code and stated time; the exercise steps it names; the setup's code."""
    notebooks = notebooks + [key for key in re.findall(r"notebook (\d\d)", paragraph) if key in NOTEBOOKS]
    texts = [text for key in notebooks for text in _cells(key)]
    texts += [path.read_text() for key, path in STEPS.items() if re.search(rf"\bstep {int(key)}\b", paragraph)]
    if line < WORKSHOP_LINES.index("## Agenda"):
        texts += [Path(REPO, name).read_text() for name in SETUP_CODE]
    return "\n".join(texts)


def _referenced(kind: str, number: str, notebooks: list[str]) -> bool:
    """`notebook 03`, `step 4`, `section 5`: a notebook, an exercise step, a heading that exists."""
    if kind.lower() == "notebook":
        return number in NOTEBOOKS
    if kind.lower() == "step":
        return f"{int(number):02d}" in STEPS
    return any(number in _headings(key) for key in notebooks)


def _unsupported(start: int, paragraph: str, notebooks: list[str]) -> list[str]:
    prose = re.sub(r"`[^`]*`", " ", paragraph)
    if prose.startswith("| "):  # an agenda row: its clock time and minutes are the agenda test's
        prose = prose.split("|", 3)[3]
    failures, references = [], set()
    for match in REFERENCE.finditer(prose):
        for number in filter(None, match.groups()[1:]):
            references.add(number)
            if not _referenced(match[1], number, notebooks):
                failures.append(f"WORKSHOP.md:{start}: {match[0]!r} names no notebook, step or section")
    sources = _numbers(_sources(prose, notebooks, start))
    identities = _identities(prose)
    for match in NUMBER.finditer(prose):
        token, percent = match[1], match[2]
        line = start + prose[: match.start()].count("\n")
        if token in references or token in identities:
            continue
        if any(piece in WORKSHOP_LINES[line - 1] and number == token for piece, number in NOT_MEASUREMENTS):
            continue
        if TIMES.match(prose[match.end() :]):
            supported = _is_ratio(token, prose)
        else:
            wanted = [_value(token)] + ([_value(token) / 100] if percent else [])
            supported = any(abs(value - want) <= _tolerance(token) for value in sources for want in wanted)
        if not supported:
            failures.append(f"WORKSHOP.md:{line}: {token}{percent} is in no output, code or identity it could be")
    return failures


def test_every_number_is_one_the_notebooks_show():
    failures = [failure for paragraph in _sections() for failure in _unsupported(*paragraph)]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("key", sorted(NOTEBOOKS))
def test_every_notebook_has_its_questions_and_answers(key):
    text = "\n".join(WORKSHOP_LINES)
    section = re.search(rf"^### Notebook {key}\b.*?(?=^##|\Z)", text, re.M | re.S)
    assert section, f"WORKSHOP.md has no '### Notebook {key}' questions"
    answers = re.findall(r"<details><summary>(.+?)</summary>(.*?)</details>", section[0], re.S)
    assert answers, f"WORKSHOP.md's notebook {key} section has no <details><summary> question"
    for question, answer in answers:
        assert answer.strip(), f"WORKSHOP.md: {question!r} has no answer"


def _stated_minutes(key: str) -> tuple[int, int]:
    """(minutes to run, at most; minutes to read) from the notebook's **Time:** line."""
    time = _cells(key)[2]
    running = re.search(r"(\d+)(?: to (\d+))? minutes? to run", time)
    reading = re.search(r"(\d+) min(?:utes?)? to read", time)
    assert running and reading, (
        f"{NOTEBOOKS[key].name}'s **Time:** line states no 'N minutes to run' and 'M minutes to read'"
    )
    return int(running[2] or running[1]), int(reading[1])


@pytest.mark.parametrize("key", sorted(NOTEBOOKS))
def test_each_notebook_states_the_reading_time_its_words_need(key):
    cells = json.loads(NOTEBOOKS[key].read_text())["cells"]
    words = sum(len("".join(cell["source"]).split()) for cell in cells if cell["cell_type"] == "markdown")
    needed = math.ceil(words / READING_WORDS_PER_MINUTE)
    assert _stated_minutes(key)[1] >= needed, (
        f"{NOTEBOOKS[key].name} has {words} words of text, {needed} minutes at {READING_WORDS_PER_MINUTE} words a "
        f"minute, but says {_stated_minutes(key)[1]} minutes to read: cut the text or say how long it takes"
    )


@pytest.mark.parametrize("key", sorted(NOTEBOOKS))
def test_each_slot_holds_the_notebooks_run_its_reading_and_a_minute(key):
    # WORKSHOP.md promises that "each notebook says at its top how long it takes to run and to read".
    running, reading = _stated_minutes(key)
    slot = re.search(rf"^\| \d+:\d\d \| (\d+) min \| \*\*notebook {key}\*\*", "\n".join(WORKSHOP_LINES), re.M)
    assert slot, f"WORKSHOP.md's agenda has no slot for notebook {key}"
    assert int(slot[1]) >= running + reading + START_MINUTES, (
        f"notebook {key}'s slot is {slot[1]} min, but it takes {running} to run, {reading} to read and "
        f"{START_MINUTES} to start"
    )
