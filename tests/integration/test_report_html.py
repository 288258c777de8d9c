"""`harness report --html` opened in a real browser (Debian's chromium under selenium): every
figure renders from the file alone, the tables, prediction and commands are there, the page is
titled by its study, its definitions are HTML and its wide table scrolls inside the page."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.study.prediction.foresight import write_prediction
from tests.conftest import harness
from tests.helpers.browser import chromium_driver
from tests.helpers.handmade_records import record

PAGE_S = 60
# What a record says of a task of one's own (harness.tasks.loading.LoadedTask.origin).
TASK = {
    "spec": "/home/me/model.py:make_task",
    "args": {"width": 64},
    "source": "/home/me/model.py",
    "sha256": "0123456789abcdef" * 4,
    "builtin": False,
}


def _runs():
    runs = []
    for world_size, runtime in ((4, 0.100), (4, 0.103), (8, 0.110), (8, 0.113)):
        run = record("ddp", world_size, 256 * world_size / runtime, local_batch=256, model="resnet50")
        run["step_breakdown"]["seconds_per_step"] = {
            "runtime": runtime,
            "forward_backward": 0.09,
            "optimizer": 0.005,
            "data_wait": 0.001,
            "other": 0.002,
            "communication": 0.0,
        }
        run["step_breakdown"]["timed_steps"] = 20
        run.update(local_world_size=4, gradient_bytes=102_228_128, tuning={}, versions={"torch": "2.x"}, task=TASK)
        runs.append(run)
    return runs


@pytest.fixture
def browser(tmp_path):
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        pytest.fail("the report test needs chromium and chromium-driver: run `make setup`")
    with chromium_driver(chromium, driver_path, tmp_path / "profile", PAGE_S) as driver:
        yield driver


def test_the_html_report_renders_its_figures_from_the_file_alone(tmp_path, browser):
    job = tmp_path / "job"
    (job / "logs").mkdir(parents=True)
    (job / "results.jsonl").write_text("".join(json.dumps(run) + "\n" for run in _runs()))
    (job / "logs" / "commands.txt").write_text("mpiexec -n 8 python -m harness train --backend ddp\n")
    write_prediction(
        str(job), "polaris", ["ddp"], [1, 2], ["--model", "resnet50", "--dataset", "synthetic", "--batch-size", "256"]
    )
    page = tmp_path / "report.html"
    result = harness("report", str(job), "--html", str(page), timeout=300)
    assert result.returncode == 0, result.stderr
    text = page.read_text()
    assert "http://" not in text and "https://" not in text  # nothing to fetch: the file is the report
    browser.get(page.as_uri())
    images = browser.find_elements("tag name", "img")
    assert len(images) >= 2
    widths = [browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth", i) for i in images]
    assert all(width and width > 0 for width in widths), widths
    body = browser.find_element("tag name", "body").text
    assert "Predicted before the runs, and measured" in body and "+" in body.split("measured")[-1]
    assert "mpiexec -n 8 python -m harness train --backend ddp" in body
    assert "Each run and its contention" in body and "2.x" in body
    assert "/home/me/model.py:make_task width=64 /home/me/model.py 0123456789ab" in body  # the task's row
    headers = [h.text for h in browser.find_elements("tag name", "th")]
    assert "error" in headers and any("95" in h for h in headers)
    # Titled by its study, not by its file; the definitions are HTML, not Markdown's asterisks.
    assert (
        browser.title
        == "Weak scaling: resnet50 on synthetic (model.py:make_task width=64), 256 samples per worker (cpu)"
    )
    assert "**" not in body and "speedup" in [b.text for b in browser.find_elements("tag name", "strong")]
    # At a laptop's width the wide scaling table scrolls inside its own box; the page does not.
    browser.set_window_size(1024, 768)
    fits = browser.execute_script(
        "const page = document.documentElement, box = document.querySelector('.table');"
        "return [page.scrollWidth <= page.clientWidth, box.getBoundingClientRect().right <= page.clientWidth,"
        " box.scrollWidth > box.clientWidth];"
    )
    assert fits == [True, True, True], "page fits, table's box fits, table scrolls inside it"
