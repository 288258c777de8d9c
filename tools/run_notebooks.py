#!/usr/bin/env python3
"""Execute notebooks in place, keeping their outputs: `tools/run_notebooks.py notebooks/NN_*.ipynb`.

Each notebook runs top to bottom in a fresh kernel started in the notebook's folder (as JupyterLab
does), each cell bounded by --cell-timeout so that a hung engine fails the run instead of hanging it.
A notebook that fails is not rewritten; its error is printed and the exit status is 1. Whatever
happens, `ipcluster stop --all` runs afterwards, so no engines outlive the run.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

CELL_TIMEOUT_S = 600  # the longest cell (a scaling sweep) on a busy 2-core machine
STOP_TIMEOUT_S = 60
log = logging.getLogger("run_notebooks")


def stop_all_clusters() -> None:
    """`ipcluster stop --all`: a second net after each notebook's own last cell."""
    ipcluster = shutil.which("ipcluster") or str(Path(sys.executable).with_name("ipcluster"))
    try:
        subprocess.run([ipcluster, "stop", "--all"], capture_output=True, timeout=STOP_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("ipcluster stop --all: %s", exc)


def execute_in_place(path: Path, cell_timeout: float) -> float:
    """Run `path` in a fresh kernel and write it back with its outputs; seconds taken.
    Raises nbclient's CellExecutionError (and the like) when a cell fails; the file is then left as it was."""
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=cell_timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    started = time.perf_counter()
    try:
        client.execute()
    finally:
        stop_all_clusters()
    seconds = time.perf_counter() - started
    nbformat.write(notebook, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebooks to execute in place")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds one cell may run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    missing = [str(path) for path in args.notebooks if not path.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}; pass paths like notebooks/01_data_parallelism.ipynb")
    failed = 0
    for path in args.notebooks:
        try:
            seconds = execute_in_place(path, args.cell_timeout)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
            failed += 1
            log.error("%s failed, left unchanged:\n%s", path, exc)
            continue
        log.info("%s: executed in %.0f s, outputs written", path, seconds)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
