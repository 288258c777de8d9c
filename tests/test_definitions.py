"""One definition each: AU, communication, useful time, the POP metrics, scaling efficiency and
contention are written once, in harness/training/metrics.py's docstring; the docs' measurement page
(docs/concepts/measurement.md), notebook 03 and the report's footnote must say exactly the same
(whitespace aside)."""

from __future__ import annotations

import json
import os

import pytest

from harness.study.report import FOOTNOTE_TERMS, scaling_report
from harness.training.metrics import DEFINITIONS

from .conftest import REPO
from .handmade_records import weak_study

REQUIRED = (
    "communication",
    "useful time",
    "AU",
    "load balance",
    "communication efficiency",
    "parallel efficiency",
    "speedup",
    "scaling efficiency",
    "contention",
)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _measurement_page() -> str:
    return open(os.path.join(REPO, "docs", "concepts", "measurement.md")).read()


def _notebook_markdown() -> str:
    notebook = json.load(open(os.path.join(REPO, "notebooks", "03_framework_scaling.ipynb")))
    return "\n".join("".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown")


def test_the_metrics_module_defines_every_term():
    assert set(REQUIRED) <= set(DEFINITIONS)


@pytest.mark.parametrize(
    "where, text",
    [
        ("docs/concepts/measurement.md", _measurement_page),
        ("notebook 03", _notebook_markdown),
        ("the report's footnote", lambda: scaling_report(weak_study())),
    ],
)
def test_each_place_says_what_the_metrics_module_says(where, text):
    flat = _flat(text())
    terms = REQUIRED if where != "the report's footnote" else FOOTNOTE_TERMS
    missing = [term for term in terms if _flat(DEFINITIONS[term]) not in flat]
    assert not missing, f"{where} lacks (or words otherwise) the definitions of {missing}"
