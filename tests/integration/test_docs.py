"""The documentation site builds: `mkdocs build --strict` (what `make docs` runs), where a broken
link, a missing anchor, a page missing from the nav or a nav entry without a page is an error, and
any warning at all fails the test. Offline: the site's theme and plugins download nothing."""

from __future__ import annotations

import sys

from tests.conftest import REPO, run

BUILD_TIMEOUT_S = 300


def test_the_site_builds_strictly_without_a_warning(tmp_path):
    site = tmp_path / "site"
    environment = {"NO_MKDOCS_2_WARNING": "1"}  # no banner about Material's successor
    result = run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        timeout=BUILD_TIMEOUT_S,
        env=environment,
        cwd=REPO,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert warnings == [], "\n".join(warnings)
    home = (site / "index.html").read_text()
    assert "The notebooks" in home and "Run a study on a cluster" in home  # the nav is rendered
    assert (site / "images" / "weak-scaling-throughput.png").stat().st_size > 0
    workshop = (site / "workshop-agenda.html").read_text()
    assert "Agenda" in workshop  # WORKSHOP.md joined the site (tools/docs_hooks.py)
