"""`harness demo` / `make demo`: the workshop CNN on the embedded digits under every backend.

Each backend runs through its own real launcher. The demo shows the harness's own progress (rank
0's epoch lines) and the comparison table; everything else every rank and launcher prints
(framework logging, launcher banners, horovodrun's per-rank prefixes) goes to one log file per run.
When a run fails, the end of its log is printed, so no rank's error is hidden. `--verbose` (or
HARNESS_VERBOSE=1) shows everything as it comes instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from typing import Optional

from ..backends import BACKENDS, get_backend
from ..errors import UsageError
from ..process.launchers import launch_environment
from ..study.scaling.report import RUN_COLUMNS, markdown_table
from ..training.launch import launch_command
from ..training.record import read_records

# Every backend trains the same experiment: the same global batch, so every row's accuracy is
# comparable; only the way the work is split differs.
DEMO_RANKS = 2
DEMO_FLAGS = ["--model", "cnn", "--dataset", "digits", "--global-batch", "64", "--lr", "0.02", "--seed", "0"]
RUN_TIMEOUT_S = 600
TAIL_LINES = 40
# Rank 0's epoch line, possibly behind a launcher's prefix such as horovodrun's "[0]<stdout>:".
PROGRESS_LINE = re.compile(r"^(?:\[\d+\]<std(?:out|err)>:\s*)?(epoch \d+/\d+ \|.*)$")
VERBOSE_VARIABLE = "HARNESS_VERBOSE"


def demo_runs() -> list[tuple[str, int]]:
    """(backend, ranks) for every registered backend: each at 2 ranks, a single-process one at 1."""
    return [(name, min(DEMO_RANKS, cls.max_world_size or DEMO_RANKS)) for name, cls in BACKENDS.items()]


def _run_quietly(command: list[str], log_path: str) -> Optional[int]:
    """Run `command`, all its output to `log_path`, progress lines also to stdout; its exit status
    (None: killed at RUN_TIMEOUT_S)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command, env=launch_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        timer = threading.Timer(RUN_TIMEOUT_S, process.kill)
        timer.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                log.write(line)
                match = PROGRESS_LINE.match(line.rstrip("\n"))
                if match:
                    print(f"   {match.group(1)}", flush=True)
            status = process.wait()
        finally:
            timer.cancel()
    return None if status == -9 else status


def _tail(path: str) -> str:
    with open(path, errors="replace") as handle:
        return "".join(handle.readlines()[-TAIL_LINES:])


def run_demo(results: Optional[str] = None, epochs: int = 3, verbose: bool = False) -> int:
    """Run every backend, print a comparison table; return non-zero if any run failed."""
    verbose = verbose or os.environ.get(VERBOSE_VARIABLE) == "1"
    stamp = time.strftime("demo-%Y%m%d-%H%M%S")
    results = results or os.path.join("runs", f"{stamp}.jsonl")
    log_dir = os.path.splitext(results)[0]  # runs/demo-<time>/<backend>.log beside runs/demo-<time>.jsonl
    os.makedirs(log_dir, exist_ok=True)
    failed: list[str] = []
    for backend, ranks in demo_runs():
        try:
            get_backend(backend).check_available()
        except UsageError as exc:
            print(f"== skipping {backend}: {exc}", flush=True)
            failed.append(backend)
            continue
        command = launch_command(ranks, backend, [*DEMO_FLAGS, "--epochs", str(epochs), "--results", results])
        log_path = os.path.join(log_dir, f"{backend}.log")
        print(
            f"== {backend} on {ranks} process(es) ({BACKENDS[backend].local_launcher} launcher"
            f"{'' if verbose else f'; full output in {log_path}'})",
            flush=True,
        )
        started = time.monotonic()
        if verbose:
            status: Optional[int] = subprocess.run(command, env=launch_environment(), timeout=RUN_TIMEOUT_S).returncode
        else:
            status = _run_quietly(command, log_path)
        if status != 0:
            failed.append(backend)
            why = "timed out" if status is None else f"exit status {status}"
            print(f"   FAILED ({why}) after {time.monotonic() - started:.1f} s", flush=True)
            if not verbose:
                print(f"   last lines of {log_path}:\n{_tail(log_path)}", file=sys.stderr, flush=True)
        else:
            print(f"   done in {time.monotonic() - started:.1f} s", flush=True)
    records = read_records([results]) if os.path.exists(results) else []
    print(f"\nCNN on digits, global batch 64, {epochs} epochs (records: {results})\n")
    print(markdown_table(records, RUN_COLUMNS))
    print(
        "\nThe 2-rank rows train the same model (same global batches, averaged gradients, no clipping), so their"
        "\nlosses agree; the 1-rank row differs only through dropout's random masks, which are drawn per rank"
        "\n(with --dropout 0 every row agrees to rounding: see tests/integration/test_equivalence.py)."
    )
    if failed:
        print(f"\nfailed or skipped: {', '.join(failed)}")
    return 1 if failed else 0
