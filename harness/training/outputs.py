"""A run's last writes, `--save-model` and `--results`: a write that still fails at the end keeps the
run's work and says where it went.

The paths were checked before training (harness.training.placement), but a run of hours can find its
file system full, over quota, or its directory removed by the time it ends. Losing the model and
the record then would lose the run. So a failed write is tried again elsewhere, in this order: a
`.kept-<pid>` file beside the path asked for (the file itself may be what failed), the same name
beside the run's other output (the model beside the results file, the record beside the model),
then `harness-kept/` in the node's temporary directory (TMPDIR). The first that works holds the
work, and one line on stderr names the path that failed, why, and where the work went; where every
one fails, the first error is raised as it would have been.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, Callable, Optional

import torch

from ..errors import first_line
from ..fileio import atomic_write
from .record import append_record

KEPT_DIRECTORY = "harness-kept"  # under TMPDIR, the last place a run's work goes


def fallback_paths(path: str, beside: Sequence[Optional[str]] = ()) -> list[str]:
    """Where `path`'s content goes when `path` cannot be written, in the order tried: beside `path`,
    beside each of the run's other outputs `beside`, then in TMPDIR/harness-kept; each once."""
    kept = f"{os.path.basename(path)}.kept-{os.getpid()}"
    directories = [os.path.dirname(os.path.abspath(path))]
    directories += [os.path.dirname(os.path.abspath(other)) for other in beside if other]
    directories.append(os.path.join(tempfile.gettempdir(), KEPT_DIRECTORY))
    return [os.path.join(directory, kept) for directory in dict.fromkeys(directories)]


def write_or_keep(
    flag: str,
    path: str,
    write: Callable[[str], None],
    what: str,
    beside: Sequence[Optional[str]] = (),
    command: str = "harness train",
) -> str:
    """`write(path)`; where it raises OSError, `write` to each of fallback_paths in turn. Returns the
    path that holds `what` (the model, the run's record), saying so in one line where it is not
    `path`; raises the first error where no path could be written."""
    try:
        write(path)
        return path
    except OSError as exc:
        failure = exc
    for fallback in fallback_paths(path, beside):
        try:
            os.makedirs(os.path.dirname(fallback), exist_ok=True)
            write(fallback)
        except OSError:
            continue
        print(
            f"{command}: warning: {flag} {path} could not be written ({first_line(failure)}); "
            f"{what} is kept in {fallback}",
            file=sys.stderr,
            flush=True,
        )
        return fallback
    raise failure


def save_model(path: str, weights: Any, results: Optional[str]) -> str:
    """--save-model's weights at `path` (atomically), else where write_or_keep keeps them."""
    return write_or_keep(
        "--save-model",
        path,
        lambda target: atomic_write(target, lambda tmp: torch.save(weights, tmp)),
        "the model",
        [results],
    )


def save_record(path: str, record: dict[str, Any], model: Optional[str], command: str = "harness train") -> str:
    """The run's record appended to --results at `path`, else where write_or_keep keeps it (`command`
    names the command in its warning)."""
    return write_or_keep(
        "--results", path, lambda target: append_record(target, record), "the run's record", [model], command
    )
