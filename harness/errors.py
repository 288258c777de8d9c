"""Errors and exit statuses shared by the CLI and the Python API."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from typing import Any

EXIT_OK = 0
EXIT_USAGE = 2  # bad input: flags, environment, files; nothing was started or written
EXIT_PREEMPTED = 3  # stopped by SIGTERM/SIGUSR1 after writing a checkpoint; resubmit to continue
EXIT_PEER_FAILURE = 4  # another rank died or a collective timed out
EXIT_OVER_BUDGET = 5  # this rank ran out of its memory cap (--memory-cap)


class UsageError(Exception):
    """Bad input. The CLI prints the message as one line and exits with status 2.

    Messages say what is wrong and name the fix, e.g. "unknown backend 'dpp'; choose one of ...".
    """


class Preempted(Exception):
    """A preemption signal stopped the run after its checkpoint was written; exit status 3.

    Resubmitting the job with `--resume auto` continues it (see harness.process.preemption).
    """

    def __init__(self, message: str, is_main: bool) -> None:
        super().__init__(message)
        self.is_main = is_main  # the CLI prints the message once, on rank 0


class PeerFailure(Exception):
    """Another rank died or stopped answering, so this rank cannot go on; exit status 4."""


class OverBudget(Exception):
    """This rank needed more memory than its cap (--memory-cap) allowed while training; exit status 5.

    The message names the rank and the fix (harness.process.memory_cap); its peers, which lose it,
    stop with PeerFailure naming the rank that stopped.
    """


def unknown_choice(kind: str, value: object, known: Iterable[object]) -> UsageError:
    """The error for a name that is not one of `known`: "unknown KIND 'VALUE'; choose one of A, B, C"."""
    return UsageError(f"unknown {kind} {value!r}; choose one of {', '.join(str(name) for name in known)}")


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (its type name if it has none), for one-line errors."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]


def require(module: str, needed_for: str, install: str, *, load: bool = True) -> Any:
    """The one way to reach an optional library: `module` imported and returned (with `load=False`
    only found, its ModuleSpec, for the files it ships, without the cost of importing it).

    Raises UsageError naming `install` (the pip command or `make setup`) where it is missing,
    "NEEDED_FOR needs NAME, which is not installed; INSTALL", or where it is there but does not
    load (a compiled extension built for another torch), "MODULE cannot be loaded (why); INSTALL".
    """
    if not load:
        try:
            spec = importlib.util.find_spec(module)
        except ImportError:  # a submodule's parent package is missing
            spec = None
        if spec is None:
            raise UsageError(f"{needed_for} needs {module}, which is not installed; {install}")
        return spec
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise UsageError(f"{needed_for} needs {exc.name}, which is not installed; {install}") from exc
        raise UsageError(f"{module} cannot be loaded ({first_line(exc)}); {install}") from exc
    except OSError as exc:  # a compiled extension whose shared library is missing
        raise UsageError(f"{module} cannot be loaded ({first_line(exc)}); {install}") from exc
