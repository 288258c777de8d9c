"""`harness demo` / `make demo`: the workshop CNN on the embedded digits under every backend."""

from __future__ import annotations

import os
import subprocess
import time
from typing import List, Optional, Tuple

from .backends import get_backend
from .errors import UsageError
from .launch import launch_command, launch_environment
from .report import RUN_COLUMNS, markdown_table
from .results import read_records

# Same global batch everywhere, so every row trains the same experiment and the accuracy
# columns are comparable; only the way the work is split differs.
DEMO_RUNS: Tuple[Tuple[str, int], ...] = (("none", 1), ("ddp", 2), ("horovod", 2), ("deepspeed", 2))
DEMO_FLAGS = ["--model", "cnn", "--dataset", "digits", "--global-batch", "64", "--lr", "0.02", "--seed", "0"]
RUN_TIMEOUT_S = 600


def run_demo(results: Optional[str] = None, epochs: int = 3) -> int:
    """Run every backend, print a comparison table; return non-zero if any run failed."""
    results = results or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S.jsonl"))
    os.makedirs(os.path.dirname(os.path.abspath(results)), exist_ok=True)
    failed: List[str] = []
    for backend, ranks in DEMO_RUNS:
        try:
            get_backend(backend).check_available()
        except UsageError as exc:
            print(f"== skipping {backend}: {exc}", flush=True)
            failed.append(backend)
            continue
        command = launch_command(ranks, backend, [*DEMO_FLAGS, "--epochs", str(epochs), "--results", results])
        print(f"== {backend} on {ranks} process(es): {' '.join(command[:3])} ...", flush=True)
        if subprocess.run(command, env=launch_environment(), timeout=RUN_TIMEOUT_S).returncode != 0:
            failed.append(backend)
    records = read_records([results]) if os.path.exists(results) else []
    print(f"\nCNN on digits, global batch 64, {epochs} epochs (records: {results})\n")
    print(markdown_table(records, RUN_COLUMNS))
    print("\nThe 2-rank rows train the same model (same global batches, averaged gradients, no clipping), so their"
          "\nlosses agree; `none` differs only through dropout's random masks, which are drawn per rank"
          "\n(with --dropout 0 every row agrees to rounding: see tests/test_equivalence.py).")
    if failed:
        print(f"\nfailed or skipped: {', '.join(failed)}")
    return 1 if failed else 0
