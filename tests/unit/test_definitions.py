"""One definition each: AU, communication, useful time, the POP metrics, scaling efficiency and
contention are written once, in harness/training/metrics.py's docstring; the docs' measurement page
(docs/concepts/measurement.md) and `harness report --explain` must say exactly the same (whitespace
aside), notebook 03 links that page instead of printing them again, and every place that computes or
labels AU uses the metrics module's function and formula, never its own."""

from __future__ import annotations

import inspect
import json
import os

import pytest

import harness.training.timing
import harness.workshop.figures
import harness.workshop.pipeline
from harness.study.scaling.report import scaling_report
from harness.study.scaling.report_notes import FOOTNOTE_TERMS
from harness.training.metrics import AU_FORMULA, DEFINITIONS, accelerator_utilisation
from tests.conftest import REPO
from tests.helpers.handmade_records import weak_study

REQUIRED = (
    "communication",
    "useful time",
    "compute time",
    "AU",
    "load balance",
    "communication efficiency",
    "parallel efficiency",
    "speedup",
    "scaling efficiency",
    "serialisation and transfer",
    "computation scalability",
    "global efficiency",
    "contention",
)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _measurement_page() -> str:
    return open(os.path.join(REPO, "docs", "concepts", "measurement.md")).read()


def _notebook_markdown(name: str = "03_framework_scaling.ipynb") -> str:
    notebook = json.load(open(os.path.join(REPO, "notebooks", name)))
    return "\n".join("".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown")


def test_the_metrics_module_defines_every_term():
    assert set(REQUIRED) <= set(DEFINITIONS)


@pytest.mark.parametrize(
    "where, text",
    [
        ("docs/concepts/measurement.md", _measurement_page),
        ("the report's footnote", lambda: scaling_report(weak_study(), explain=True)),
    ],
)
def test_each_place_says_what_the_metrics_module_says(where, text):
    flat = _flat(text())
    terms = REQUIRED if where != "the report's footnote" else FOOTNOTE_TERMS
    missing = [term for term in terms if _flat(DEFINITIONS[term]) not in flat]
    assert not missing, f"{where} lacks (or words otherwise) the definitions of {missing}"


def test_notebook_03_links_the_definitions_and_repeats_none():
    markdown = _flat(_notebook_markdown())
    assert "](../docs/concepts/measurement.md#the-step-breakdown-and-the-metrics)" in markdown
    assert "## The step breakdown and the metrics" in _measurement_page()  # the anchor the link names
    repeated = [term for term in REQUIRED if _flat(DEFINITIONS[term]) in markdown]
    assert not repeated, f"notebook 03 prints the definitions of {repeated} again: link the measurement page"


def test_au_is_dlios_compute_time_over_total_time_everywhere():
    """AU has one definition: the docstring's, the formula's few words and the one function."""
    assert AU_FORMULA.split(" = ")[1] in _flat(DEFINITIONS["AU"])
    assert accelerator_utilisation(3.0, 4.0) == 0.75
    # The record (timing), the pipeline study and its figure compute and label AU with these, and
    # no other formula for it is written there.
    for module in (harness.training.timing, harness.workshop.pipeline):
        source = inspect.getsource(module)
        assert "accelerator_utilisation(" in source, module.__name__
        assert "(compute + data wait)" not in source and "/ (computed + waited)" not in source, module.__name__
    assert "AU_FORMULA" in inspect.getsource(harness.workshop.figures)
    pipeline_notebook = _flat(_notebook_markdown("04_data_pipeline.ipynb"))
    assert "compute / (compute + data wait)" not in pipeline_notebook and AU_FORMULA in pipeline_notebook
