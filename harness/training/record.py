"""Results as data: one JSON object per run, appended to a JSONL file that plots and reports read."""

from __future__ import annotations

import fcntl
import json
import math
import os
import platform
import socket
import sys
from typing import Any, Dict, Iterable, List, Sequence

# Two-sided 95% Student-t quantiles for 1..30 degrees of freedom; the normal 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def mean_and_ci95(values: Sequence[float]) -> Dict[str, Any]:
    """Mean and half-width of its 95% confidence interval (None with fewer than two values)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = sum(values) / n
    if n < 2:
        return {"mean": mean, "ci95": None, "n": 1}
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    quantile = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return {"mean": mean, "ci95": quantile * std / math.sqrt(n), "n": n}


def library_versions() -> Dict[str, str]:
    """Versions of Python and the libraries every run uses."""
    import numpy
    import torch

    from ..version import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "harness": __version__, "cuda": torch.version.cuda or "none"}


def host_info() -> Dict[str, Any]:
    """Where the run happened."""
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "argv": sys.argv}


def append_record(path: str, record: Dict[str, Any]) -> None:
    """Append one record as one line: a single write under an exclusive lock, then fsync.

    A reader never sees half a record, and concurrent jobs appending to one file do not interleave.
    """
    line = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


JOB_RESULTS = "results.jsonl"  # what the job templates in submissions/ write at the top of a job's directory


def read_results(paths: Iterable[str]) -> List[Dict[str, Any]]:
    """The records of results files that must exist (a missing one is a UsageError naming the fix).

    A directory stands for the results.jsonl of a job directory that the job templates write (its
    other JSONL files, such as discovery-<job>.jsonl, are not run records)."""
    from ..errors import UsageError

    paths = [os.path.join(path, JOB_RESULTS) if os.path.isdir(path) else path for path in paths]
    missing = [path for path in paths if not os.path.isfile(path)]
    if missing:
        raise UsageError(f"results file {missing[0]} does not exist; run `harness sweep --results FILE` first")
    return read_records(paths)


def read_records(paths: Iterable[str]) -> List[Dict[str, Any]]:
    """All records of the given JSONL files, in file order."""
    records = []
    for path in paths:
        with open(path) as handle:
            records.extend(json.loads(line) for line in handle if line.strip())
    return records
