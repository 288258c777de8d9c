"""Every notebook in notebooks/ runs top to bottom with nbval in lax mode: the cells' own `assert`s
carry the lessons (equivalence, warmup, exact evaluation), and a cell that raises fails the test.

Each notebook runs in its own pytest subprocess, bounded per cell (--nbval-cell-timeout) and as a
whole, so a hung engine fails the test in bounded time, with an IPython folder of its own, so that
its teardown stops only its own clusters (not an attendee's, nor another test's). Every process the
notebook starts inherits a marker variable unique to the test; the teardown runs `ipcluster stop
--all` on that folder and then kills whatever still carries the marker, so a failed notebook leaves
no engines behind.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.process.processes import kill_processes_with_environment, processes_with_environment
from tests.conftest import REPO

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))
CELL_TIMEOUT_S = 600
NOTEBOOK_TIMEOUT_S = 900
EXIT_GRACE_S = 15
MARKER = "HARNESS_NOTEBOOK_TEST"
# The notebooks whose lessons are timings (speedups and shares of a step, against their intervals): they
# run alone in `make test`. The others' lessons (equivalence, accuracy) hold whatever else the machine runs.
TIMED = {
    "03_framework_scaling.ipynb",
    "04_data_pipeline.ipynb",
    "05_processes_per_device.ipynb",
    "06_precision_checkpoints_profiling.ipynb",
    "07_memory_and_sharding.ipynb",
}
# Alone as well: notebook 02 keeps both cores busy for minutes (33 trainings, two at a time), and beside
# another lane it took 2.7 times as long as alone (562 s against 206 s), near its own time limit.
ALONE = TIMED | {"02_lr_scaling_and_warmup.ipynb"}


def stop_all_clusters(environment: dict[str, str]) -> None:
    """Every cluster of the IPython folder `environment` names (IPYTHONDIR)."""
    ipcluster = str(Path(sys.executable).with_name("ipcluster"))
    subprocess.run([ipcluster, "stop", "--all"], capture_output=True, timeout=60, check=False, env=environment)


@pytest.fixture
def notebook_environment(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The notebook's environment: a private IPython folder and MARKER; after the test, its clusters
    are stopped and every process carrying its MARKER value is killed."""
    environment = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"), MARKER: uuid.uuid4().hex}
    yield environment
    stop_all_clusters(environment)
    kill_processes_with_environment(MARKER, environment[MARKER])


def test_notebooks_found() -> None:
    names = [os.path.basename(path) for path in NOTEBOOKS]
    assert {"01_data_parallelism.ipynb", "02_lr_scaling_and_warmup.ipynb", "03_framework_scaling.ipynb"} <= set(names)
    assert ALONE <= set(names), ALONE - set(names)


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 60)  # the notebook's own bound, not pytest-timeout's 600 s default
@pytest.mark.parametrize(
    "notebook",
    [pytest.param(path, marks=pytest.mark.alone if os.path.basename(path) in ALONE else ()) for path in NOTEBOOKS],
    ids=os.path.basename,
)
def test_notebook_runs(notebook: str, notebook_environment: dict[str, str]) -> None:
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--nbval-lax",
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--rootdir",
        os.path.dirname(notebook),
        notebook,
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=notebook_environment,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=NOTEBOOK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{os.path.basename(notebook)} did not finish within {NOTEBOOK_TIMEOUT_S} s:\n{output[-5000:]}")
    # The first failing cell is the cause; later ones often fail only for what it left undefined.
    first = output.find("= FAILURES =")
    shown = output[first : first + 6000] + "\n...\n" if first >= 0 else ""
    assert process.returncode == 0, f"{os.path.basename(notebook)} failed:\n{shown}{output[-4000:]}"
    # The notebook's last cell stops its cluster: nothing it started may still run (the kernel
    # gets a few seconds to exit after nbval shuts it down).
    deadline = time.monotonic() + EXIT_GRACE_S
    marker = notebook_environment[MARKER]
    while (leftovers := processes_with_environment(MARKER, marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftovers, f"processes left running by {os.path.basename(notebook)}: {leftovers}"
