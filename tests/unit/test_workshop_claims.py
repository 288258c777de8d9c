"""Each claim WORKSHOP.md's answers make about a notebook's run is asserted against the output of the
one cell that shows it, not against a number found anywhere in the notebook; and each notebook's
summary ("What to remember") is checked point by point by the code cell right after it.

Read from the notebooks' JSON as committed: nothing is executed. A re-execution whose outputs say
otherwise fails here, naming the claim, until the text says what the outputs show.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Callable, Optional, Union

import pytest

from tests.unit.test_workshop_numbers import (
    NOT_MEASUREMENTS,
    NOTEBOOKS,
    NUMBER,
    REFERENCE,
    TIMES,
    WORKSHOP_LINES,
    _identities,
    _is_ratio,
    _numbers,
    _tolerance,
    _value,
)

# The notebooks whose answers and summaries this file holds to their cells.
CHECKED = ("01", "02", "03", "04", "05", "06")
SUMMARY = "## What to remember"


@dataclass(frozen=True)
class Claim:
    """`words` (verbatim in WORKSHOP.md's section of the notebook, whitespace aside) state what the
    output of the code cell `cell` shows: `pattern` finds it there; each named group in `shows` must
    equal the number(s) the words write for it; `holds`, given the groups as numbers (None where an
    optional group did not match), checks what the words say without a number."""

    notebook: str
    cell: str
    words: str
    pattern: str
    shows: Mapping[str, Union[str, tuple[str, ...]]] = field(default_factory=dict)
    holds: Optional[Callable[[dict[str, Optional[float]]], bool]] = None


CLAIMS = (
    Claim("01", "3366a760", "One process with batch 32", r"one process: global batch (?P<batch>\d+)", {"batch": "32"}),
    Claim("01", "b8c768b2", "the run no longer equals one process without clipping", r"; the clipped run is not$"),
    Claim(
        "03",
        "nb03-19",
        "each step gathers the parameters (all-gathers in forward and backward) and reduce-scatters the gradients",
        r"^\s*fsdp x2, round \d+: .*all_gather .*reduce_scatter",
    ),
    Claim(
        "03",
        "nb03-26",
        "the 2-rank runs want more threads than there are cores (each record says by how much, in words)",
        r"own demand at 2 ranks: .* the configuration oversubscribes its cores [\d.]+x",
    ),
    Claim(
        "03",
        "nb03-33b",
        "prints each configuration's computation scalability beside its runs' threads per core and their waits "
        "for a core, and says what they point to",
        r"computation scalability [\d.]+; threads per core [\d.]+ -> [\d.]+; threads waited for a core \d+% -> \d+%"
        r".*\n\s+-> ",
    ),
    Claim(
        "04",
        "0cab82ad",
        "2 × 149 − 297 = 1 at 2 ranks, 8 × 38 − 297 = 7 at 8",
        r"^\s*2 ranks: \d+ scored,\s+(?P<two>\d+) twice(?s:.*?)^\s*8 ranks: \d+ scored,\s+(?P<eight>\d+) twice",
        {"two": "1", "eight": "7"},
    ),
    Claim(
        "04",
        "541287bf",
        "Decoding images one by one lowers it; prepared arrays raise it.",
        r"AU (?P<decoded>[\d.]+) against (?P<prepared>[\d.]+)",
        holds=lambda g: g["decoded"] < g["prepared"],
    ),
    Claim(
        "04",
        "58848b2b",
        "Notebook 04 prints that bound and, with its 95% interval, what one worker did",
        r"one worker at best x[\d.]+; measured x[\d.]+ \(95% interval",
    ),
    Claim(
        "05",
        "2a1a51bc",
        "says whether the run could tell them apart",
        r"^-> (?:NOT RESOLVED|several processes are FASTER|one process with the threads is FASTER)",
    ),
    Claim(
        "05",
        "acae54e37e7d407bbb7b55eff062a284",
        "whether that slower forward and backward is resolved or not",
        r"^forward\+backward per step: two processes x[\d.]+ the reference's \(95% interval [\d.]+ to [\d.]+\): "
        r"(?:SLOWER|not resolved)",
    ),
    Claim(
        "06",
        "02450781",
        "below 6.1e-05 it keeps only subnormals (fewer significant bits) and below its smallest subnormal, "
        "5.96e-08, nothing",
        r"^\s*fp16\s+16\s+65504\s+(?P<normal>\S+)\s+(?P<subnormal>\S+)",
        {"normal": "6.1e-05", "subnormal": "5.96e-08"},
    ),
    Claim(
        "06",
        "17c01264",
        "some of one backward's gradients were flushed to zero (a relative error of 100%)",
        r"^\s*fp16\s+(?P<flushed>[\d,]+)\s+[\d,]+\s+\d+\s+\S+\s+(?P<largest>\S+)\s*$",
        {"largest": "100%"},
        lambda g: g["flushed"] > 0,
    ),
    Claim(
        "06",
        "17c01264",
        "multiplied by the loss scale, 2^16, before rounding, none was",
        r"^fp16 x (?P<scale>\d+)\s+(?P<flushed>[\d,]+)",
        {"scale": "2^16"},
        lambda g: g["flushed"] == 0,
    ),
    Claim(
        "06",
        "02450781",
        "bf16 has fp32's range (smallest normal 1.18e-38 in both)",
        r"^\s*fp32\s+32\s+\S+\s+(?P<fp32>\S+)(?s:.*)^\s*bf16\s+16\s+\S+\s+(?P<bf16>\S+)",
        {"fp32": "1.18e-38", "bf16": "1.18e-38"},
    ),
    Claim(
        "06",
        "17c01264",
        "none was flushed, with no scale",
        r"^\s*bf16\s+(?P<flushed>[\d,]+)",
        holds=lambda g: g["flushed"] == 0,
    ),
    Claim(
        "06",
        "02450781",
        "its rounding step is 0.00781 against fp16's 0.000977",
        r"^\s*bf16\s+16(?:\s+\S+){3}\s+(?P<bf16>\S+)(?s:.*)^\s*fp16\s+16(?:\s+\S+){3}\s+(?P<fp16>\S+)",
        {"bf16": "0.00781", "fp16": "0.000977"},
    ),
    Claim(
        "06",
        "17c01264",
        "its median rounding error was several times that of fp16 with the loss scale",
        r"^\s*bf16(?:\s+[\d,]+){3}\s+(?P<bf16>\S+)(?s:.*)^fp16 x \d+(?:\s+[\d,]+){3}\s+(?P<scaled>\S+)",
        holds=lambda g: g["bf16"] > 3 * g["scaled"],
    ),
    Claim(
        "06",
        "933dce18",
        "Started at 2^22, 4 of 8 steps were skipped and the scale settled at 2^18 (262144)",
        r"(?P<skipped>\d+) of (?P<steps>\d+) steps skipped; the scale went from (?P<start>2\^\d+) to (?P<end>\d+)",
        {"skipped": "4", "steps": "8", "start": "2^22", "end": ("2^18", "262144")},
    ),
    Claim(
        "06",
        "3d375d1c",
        "fp16 adds its loss scaler's 8 bytes",
        r"^fp16: .*\n.*'framework': (?P<framework>\d+)",
        {"framework": "8"},
    ),
    Claim(
        "06",
        "d9947a05",
        "10.63 MiB in fp32 against 8.73 MiB in bf16 or fp16, by less than half: the int64 indices of "
        "max-pooling (2.25 MiB) stay, and autocast keeps 16-bit copies of the weights (2.29 MiB)",
        r"^fp32: (?P<fp32>[\d.]+) MiB(?s:.*)^bf16: (?P<bf16>[\d.]+) MiB.*'int64': '(?P<int64>[\d.]+) MiB'"
        r"(?s:.*)^fp16: (?P<fp16>[\d.]+) MiB(?s:.*)^16-bit weight copies: (?P<copies>[\d.]+) MiB",
        {"fp32": "10.63", "bf16": "8.73", "fp16": "8.73", "int64": "2.25", "copies": "2.29"},
    ),
    Claim(
        "06",
        "b7e2c0a3",
        "which convolution kernels each format ran",
        r"^-> fp16: (?:slower than fp32|faster than fp32|not resolved), with (?:torch's generic fallback|oneDNN's kernels)",
    ),
    Claim(
        "06",
        "acbe1554",
        "both stop after step 6, write the checkpoint `step-00000006` and exit with status 3",
        r"^exit status (?P<status>\d+)$(?s:.*)after step (?P<step>\d+) of \d+;",
        {"status": "3", "step": "6"},
    ),
    Claim(
        "06",
        "25d62ab3",
        "the largest difference was 0.0",
        r"largest difference from the uninterrupted run: (?P<difference>\S+)$",
        {"difference": "0.0"},
    ),
    Claim(
        "06",
        "860fe867",
        "a rank's allreduce bars lie under its backward bars",
        r"^rank 0: \d+ allreduces, (?P<during>\d+) of them started during backward",
        holds=lambda g: g["during"] > 0,
    ),
    Claim(
        "06",
        "a06e1047",
        "notebook 06 prints the median gaps of those pairs, and their ends agree far more closely than their starts",
        r"median \|start gap\| (?P<start>[\d.]+) ms, median \|end gap\| (?P<end>[\d.]+) ms"
        r"|(?P<few>too few such allreduces)|(?P<none>no imbalance to explain)",
        holds=lambda g: g["start"] is None or g["end"] < 0.5 * g["start"],
    ),
)


def _flat(text: str) -> str:
    return " ".join(text.split())


@cache
def _notebook(key: str) -> list[dict]:
    return json.loads(NOTEBOOKS[key].read_text())["cells"]


def _output(key: str, cell_id: str) -> str:
    """Everything the cell printed or displayed (text, plain and markdown), as committed."""
    cells = [cell for cell in _notebook(key) if cell.get("id") == cell_id]
    assert len(cells) == 1 and cells[0]["cell_type"] == "code", f"notebook {key} has no code cell {cell_id!r}"
    texts = []
    for output in cells[0].get("outputs", []):
        data = output.get("data", {})
        texts += [output.get("text", ""), data.get("text/plain", ""), data.get("text/markdown", "")]
    return "\n".join("".join(text) for text in texts)


def _section(key: str) -> str:
    text = "\n".join(WORKSHOP_LINES)
    found = re.search(rf"^### Notebook {key}\b.*?(?=^##|\Z)", text, re.M | re.S)
    assert found, f"WORKSHOP.md has no '### Notebook {key}' questions"
    return found[0]


def _number(text: Optional[str]) -> Optional[float]:
    return None if text is None else _value(text.replace("%", ""))


def _agrees(token: str, value: Optional[float]) -> bool:
    """The words' `token` ("100%", "2^16", "8.73") is the output's `value`, to the token's precision."""
    number = token.rstrip("%")
    if value is None:
        return False
    if abs(value - _value(number)) <= _tolerance(number):
        return True
    return token.endswith("%") and abs(value - _value(number) / 100) <= _tolerance(number) / 100


@pytest.mark.parametrize("claim", CLAIMS, ids=lambda claim: f"{claim.notebook}-{claim.cell}-{claim.words[:30]}")
def test_each_claim_is_what_the_cell_it_names_shows(claim):
    assert _flat(claim.words) in _flat(_section(claim.notebook)), f"WORKSHOP.md no longer says {claim.words!r}"
    output = _output(claim.notebook, claim.cell)
    found = re.search(claim.pattern, output, re.M)
    assert found, f"notebook {claim.notebook}'s cell {claim.cell} shows nothing like {claim.pattern!r}:\n{output}"
    groups = {name: _number(value) for name, value in found.groupdict().items()}
    for name, tokens in claim.shows.items():
        for token in (tokens,) if isinstance(tokens, str) else tokens:
            assert token in claim.words, f"{token!r} is not among the words {claim.words!r}"
            assert _agrees(token, groups[name]), (
                f"WORKSHOP.md says {token} ({claim.words!r}); notebook {claim.notebook}'s cell {claim.cell} shows "
                f"{found[name]}"
            )
    assert claim.holds is None or claim.holds(groups), (
        f"WORKSHOP.md says {claim.words!r}; notebook {claim.notebook}'s cell {claim.cell} shows {found[0]!r}"
    )


def _answers(key: str) -> list[str]:
    """The answers of the notebook's questions, code spans left out (commands, not claims)."""
    answers = re.findall(r"</summary>(.*?)</details>", _section(key), re.S)
    return [re.sub(r"`[^`]*`", " ", answer) for answer in answers]


@pytest.mark.parametrize("key", CHECKED)
def test_every_measured_number_in_an_answer_is_a_claim(key):
    """A number an answer writes is a setting of the notebook's code, a reference, an identity or a
    ratio written out beside it, or one of the notebook's claims, tied to the cell that shows it."""
    settings = set(
        _numbers("\n".join("".join(cell["source"]) for cell in _notebook(key) if cell["cell_type"] == "code"))
    )
    claimed = {
        token
        for claim in CLAIMS
        if claim.notebook == key
        for tokens in claim.shows.values()
        for token in ((tokens,) if isinstance(tokens, str) else tokens)
    }
    loose = []
    for answer in _answers(key):
        references = {number for match in REFERENCE.finditer(answer) for number in match.groups()[1:] if number}
        exempt = references | _identities(answer) | {number for _, number in NOT_MEASUREMENTS}
        for match in NUMBER.finditer(answer):
            token = match[1] + match[2]
            if match[1] in exempt or token in claimed or _value(match[1]) in settings:
                continue
            if TIMES.match(answer[match.end() :]) and _is_ratio(match[1], answer):
                continue
            loose.append(token)
    assert not loose, f"WORKSHOP.md's notebook {key} answers state {loose}, tied to no cell: add a Claim"


@pytest.mark.parametrize("key", CHECKED)
def test_each_summary_is_checked_by_the_cell_after_it(key):
    cells = _notebook(key)
    at = [i for i, cell in enumerate(cells) if "".join(cell["source"]).startswith(SUMMARY)]
    assert len(at) == 1, f"notebook {key} has no single {SUMMARY!r} cell"
    summary = "".join(cells[at[0]]["source"])
    assert "The cell below checks each point" in summary, f"notebook {key}'s summary does not say what checks it"
    after = cells[at[0] + 1] if at[0] + 1 < len(cells) else {"cell_type": "none", "source": []}
    checks = "".join(after["source"]).count("assert ")
    points = len(re.findall(r"^- ", summary, re.M))
    assert after["cell_type"] == "code" and checks >= points, (
        f"notebook {key}: the cell after its summary asserts {checks} times for {points} points"
    )
