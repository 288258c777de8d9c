"""harness plot as a command."""

from __future__ import annotations

from tests.conftest import harness


def test_plot_cli_names_a_missing_results_file(tmp_path):
    result = harness("plot", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "fig"), timeout=120)
    assert result.returncode == 2
    assert "missing.jsonl does not exist; run `harness sweep --results FILE` first" in result.stderr
    assert not list(tmp_path.iterdir())
