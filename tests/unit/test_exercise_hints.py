"""An exercise's hints say what to do and why, and leave the code to the attendee: no hint writes a
call that its block's code makes (naming a tool, such as DistributedSampler, is fine; writing
`DistributedSampler(` with its arguments is the answer)."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

from harness import workshop
from tests.conftest import REPO

SOLUTIONS = sorted(Path(REPO, "solutions").glob("*.py"))


def _hint_and_code(lines: list[str], block: workshop.TodoBlock) -> tuple[str, str]:
    body = lines[block.first + 1 : block.last]
    comments = 0
    while comments < len(body) and body[comments].lstrip().startswith("#"):
        comments += 1
    return "\n".join(body[:comments]), textwrap.dedent("\n".join(body[comments:]))


def _calls(code: str) -> set[str]:
    return {ast.unparse(node.func) for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Call)}


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda path: path.name)
def test_no_hint_writes_the_call_its_block_makes(solution: Path):
    text = solution.read_text()
    lines = text.splitlines()
    written = []
    for block in workshop.todo_blocks(text, solution.name):
        hint, code = _hint_and_code(lines, block)
        assert hint, f"{solution.name}: TODO({block.key}) has no hint"
        written += [
            f"TODO({block.key}): {call}(" for call in _calls(code) if re.search(rf"{re.escape(call)}\s*\(", hint)
        ]
    assert not written, f"{solution.name}: hints that write their block's calls: {written}"


def test_the_check_catches_a_hint_that_writes_its_call():
    lines = [
        "# TODO(shard): deal out the samples",
        "# DistributedSampler(train_set, rank=rank)",
        "x = 1",
        "# END TODO",
    ]
    block = workshop.todo_blocks("\n".join(lines))[0]
    hint, _ = _hint_and_code(lines, block)
    assert re.search(r"DistributedSampler\s*\(", hint) and "DistributedSampler" in _calls("DistributedSampler(a)")
