"""JupyterLab as an attendee meets it, in a real browser: `tools/lab.sh` started as `make lab REMOTE=1`
starts it (as root here, so with --allow-root; a token; a free port on 127.0.0.1), headless Chromium
driven by Selenium opens notebook 01 and runs its first code cells on the kit's kernel, and their
output shows. A screenshot is kept (in the test's tmp folder and build/test-artifacts/).

The notebook's first code cell starts two ipyparallel MPI engines, and its second prints each
engine's rank; the test then stops them from a cell of its own, as the notebook's last cell would,
and asserts none is left. It runs on a copy of the notebook with its stored outputs cleared, so
only this run's outputs can satisfy it and nothing in notebooks/ is written, and with Jupyter's
and IPython's folders in the tmp folder, so no setting or cluster of the machine's user is read or
stopped. Every process it starts (JupyterLab, its kernel, the engines, chromedriver, Chromium)
carries a marker variable; the fixtures' finalizers stop JupyterLab and Chromium, run
`ipcluster stop --all` on the private IPython folder, and kill whatever still carries the marker,
pass or fail.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from harness.process.launchers import free_port
from harness.process.processes import command_line, kill_processes_with_environment, processes_with_environment
from tests.conftest import REPO
from tests.helpers.browser import chromium_driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

NOTEBOOK = "01_data_parallelism.ipynb"
ARTIFACTS = Path(REPO, "build", "test-artifacts")
MARKER = "HARNESS_LAB_BROWSER_TEST"
LAB_START_S = 120  # JupyterLab answering on its port (a cold start imports its server extensions)
PAGE_S = 90  # the page, the notebook and an idle kernel
ENGINES_S = 240  # cell 1 starts MPI engines (cold torch imports on 2 shared cores)
STOP_S = 20  # JupyterLab and Chromium after SIGTERM or quit(), before SIGKILL


@dataclass
class Lab:
    """A running JupyterLab: where it answers, its token, the folder it serves, its log."""

    url: str
    token: str
    root: Path
    log: Path
    marker: str

    def api(self, path: str) -> Any:
        """GET /api/PATH with the token, as JSON."""
        request = urllib.request.Request(f"{self.url}/api/{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)


def _browser_tools() -> tuple[str, str]:
    """Chromium and chromedriver; skipped where a user cannot install them, failed where make setup should have."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        selenium_missing = True
    else:
        selenium_missing = False
    if chromium and driver and not selenium_missing:
        return chromium, driver
    missing = [
        name
        for name, absent in (
            ("chromium", not chromium),
            ("chromium-driver", not driver),
            ("selenium (pip)", selenium_missing),
        )
        if absent
    ]
    message = f"the browser test needs {', '.join(missing)}: run `make setup`"
    if os.geteuid() == 0:  # make setup installs them as root: their absence is a set-up bug
        pytest.fail(message)
    pytest.skip(f"{message} (as root), or: sudo apt-get install chromium chromium-driver")


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def _fresh_notebook(root: Path) -> None:
    """notebooks/NOTEBOOK under `root`, its stored outputs and execution counts cleared."""
    notebook = json.loads(Path(REPO, "notebooks", NOTEBOOK).read_text())
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / NOTEBOOK).write_text(json.dumps(notebook, indent=1))


def _private_jupyter(home: Path) -> dict[str, str]:
    """Jupyter's and IPython's folders under `home`, with JupyterLab's news prompt off (a toast over the page)."""
    folders = {
        name: str(home / name.lower())
        for name in (
            "JUPYTER_CONFIG_DIR",
            "JUPYTER_DATA_DIR",
            "JUPYTER_RUNTIME_DIR",
            "JUPYTERLAB_SETTINGS_DIR",
            "JUPYTERLAB_WORKSPACES_DIR",
            "IPYTHONDIR",
        )
    }
    settings = Path(folders["JUPYTERLAB_SETTINGS_DIR"], "@jupyterlab", "apputils-extension")
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    return folders


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process group (JupyterLab shuts its kernels down), SIGKILL after STOP_S."""
    for signum, wait in ((signal.SIGTERM, STOP_S), (signal.SIGKILL, 5)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def _wait_until_answering(lab: Lab, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + LAB_START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"tools/lab.sh exited with {process.returncode}:\n{_tail(lab.log)}")
        try:
            lab.api("status")
            return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer on {lab.url} within {LAB_START_S} s:\n{_tail(lab.log)}")


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab started as `make lab REMOTE=1` starts it, on a copy of notebook 01; stopped after
    the test with everything it started (engines included)."""
    _browser_tools()  # skip (or fail) before starting anything
    root, marker, port = tmp_path / "kit", uuid.uuid4().hex, free_port()
    _fresh_notebook(root)
    folders = _private_jupyter(tmp_path / "home")
    lab = Lab(f"http://127.0.0.1:{port}", uuid.uuid4().hex, root, tmp_path / "lab.log", marker)
    env = {
        **os.environ,
        **folders,
        MARKER: marker,
        "VENV": str(Path(sys.executable).parent.parent),
        "REMOTE": "1",
        "LAB_IP": "127.0.0.1",
        "LAB_PORT": str(port),
        "LAB_ROOT": str(root),
        "JUPYTER_TOKEN": lab.token,
    }
    with open(lab.log, "w") as log:
        process = subprocess.Popen(
            ["bash", str(Path(REPO, "tools", "lab.sh"))],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        _wait_until_answering(lab, process)
        yield lab
    finally:
        _stop_group(process)
        subprocess.run(
            [str(Path(sys.executable).with_name("ipcluster")), "stop", "--all"],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        kill_processes_with_environment(MARKER, marker)


@pytest.fixture
def browser(tmp_path: Path, lab: Lab) -> Iterator[Any]:
    """Headless Chromium under chromedriver, with a fresh profile; quit (or killed) after the test."""
    chromium, chromedriver = _browser_tools()
    # Chromium inherits chromedriver's environment, so a marker of its own reaches every browser process.
    marker = f"{lab.marker}-browser"
    try:
        with chromium_driver(
            chromium,
            chromedriver,
            tmp_path / "chromium-profile",
            PAGE_S,
            STOP_S,
            flags=["--window-size=1400,1050"],
            environ={**os.environ, MARKER: marker},
            log=tmp_path / "chromedriver.log",
        ) as driver:
            yield driver
    finally:
        kill_processes_with_environment(MARKER, marker)


# --- driving the page ------------------------------------------------------------------------------


def _wait(driver: Any, what: str, condition: Callable[[], object], timeout: float, lab: Lab) -> object:
    """condition()'s first true value, polled; the test fails naming `what` after `timeout` s."""
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def check(_) -> object:
        try:
            return condition()
        except WebDriverException:  # an element re-rendered under us: ask again
            return False

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.5).until(check)
    except TimeoutException:
        pytest.fail(f"{what} did not happen within {timeout} s; JupyterLab's log:\n{_tail(lab.log)}")


def _cells(driver: Any) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell")


def _output(cell: Any) -> str:
    from selenium.webdriver.common.by import By

    return "\n".join(area.text for area in cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output"))


def _run_cell(driver: Any, cell: Any) -> None:
    """Select `cell` by its prompt (command mode) and press Shift+Enter, as an attendee does."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", cell)
    cell.find_element(By.CSS_SELECTOR, ".jp-InputArea-prompt").click()
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()


def _add_cell_below(driver: Any, cell: Any, code: str) -> None:
    """A new code cell under `cell` holding `code`, run: B, Enter, type, Shift+Enter."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    cell.find_element(By.CSS_SELECTOR, ".jp-InputArea-prompt").click()
    ActionChains(driver).send_keys("b").pause(0.5).send_keys(Keys.ENTER).pause(0.3).send_keys(code).pause(
        0.3
    ).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()


def _kernel_idle(lab: Lab) -> bool:
    kernels = lab.api("kernels")
    return bool(kernels) and all(kernel["execution_state"] == "idle" for kernel in kernels)


def _engines_left(marker: str) -> list[int]:
    return [pid for pid in processes_with_environment(MARKER, marker) if "ipyparallel" in (command_line(pid) or "")]


def _keep_screenshot(driver: Any, tmp_path: Path, name: str) -> Path:
    """A PNG of the page in the test's tmp folder, copied to build/test-artifacts/ (git-ignored)."""
    path = tmp_path / name
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, ARTIFACTS / name)
    return path


# --- the test --------------------------------------------------------------------------------------


def test_notebook_01_runs_its_first_cells_in_jupyterlab_in_a_browser(lab: Lab, browser: Any, tmp_path: Path) -> None:
    (ARTIFACTS / "lab_browser_failure.png").unlink(missing_ok=True)  # a former run's
    try:
        _open_and_run(browser, lab, tmp_path)
    except BaseException:
        _keep_screenshot(browser, tmp_path, "lab_browser_failure.png")
        raise


def _open_and_run(driver: Any, lab: Lab, tmp_path: Path) -> None:
    cells_stored = json.loads((lab.root / "notebooks" / NOTEBOOK).read_text())["cells"]
    code = [index for index, cell in enumerate(cells_stored) if cell["cell_type"] == "code"]
    driver.get(f"{lab.url}/lab/tree/notebooks/{NOTEBOOK}?token={lab.token}")
    _wait(driver, "JupyterLab's page loading", lambda: "JupyterLab" in driver.title or _cells(driver), PAGE_S, lab)
    cells = _wait(
        driver,
        f"{NOTEBOOK} opening with its {len(cells_stored)} cells",
        lambda: len(_cells(driver)) == len(cells_stored) and _cells(driver),
        PAGE_S,
        lab,
    )
    _wait(driver, "the notebook's kernel starting and going idle", lambda: _kernel_idle(lab), PAGE_S, lab)
    sessions = lab.api("sessions")
    assert [(session["path"], session["kernel"]["name"]) for session in sessions] == [
        (f"notebooks/{NOTEBOOK}", "python3")
    ], sessions

    start, ranks = cells[code[0]], cells[code[1]]  # start_engines(); %%px: each engine prints its rank
    _run_cell(driver, start)
    _run_cell(driver, ranks)
    started = _wait(
        driver,
        "the engines starting (first code cell's output)",
        lambda: "MPI engines" in _output(start) and _output(start),
        ENGINES_S,
        lab,
    )
    # The engines run the kernel's own Python: the kit's environment, not the system's.
    assert f"{Path(sys.executable).parent}{os.sep}python" in started and "-m ipyparallel.engine" in started, started
    printed = _wait(
        driver,
        "every engine printing its rank (second code cell's output)",
        lambda: "rank 1 of 2" in _output(ranks) and _output(ranks),
        ENGINES_S,
        lab,
    )
    assert "rank 0 of 2, process" in printed and "rank 1 of 2, process" in printed, printed
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", start)
    screenshot = _keep_screenshot(driver, tmp_path, "lab_browser_notebook_01.png")
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and screenshot.stat().st_size > 10_000

    _add_cell_below(driver, ranks, 'print("stopped", engines.stop())')
    _wait(
        driver,
        "engines.stop() from a cell of the test's own",
        lambda: any("stopped" in _output(cell) for cell in _cells(driver)),
        ENGINES_S,
        lab,
    )
    _wait(driver, "the engines' processes ending", lambda: not _engines_left(lab.marker), STOP_S, lab)
