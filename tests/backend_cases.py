"""The registered backends as the contract tests run them, read from harness.backends' registry.

A backend registered there joins every test that parametrises over these (equivalence with one
process, preemption and exact resume, a dead or hung rank, precision, the demo) with no test
edit; what differs between backends comes from the backend class (its launcher, its rank limit,
its Options examples), never from an `if` on its name.
"""

from __future__ import annotations

from typing import List

import pytest

from harness.backends import BACKENDS

ALL = list(BACKENDS)
# Backends that run on any number of ranks (the single-process baseline runs on one).
DISTRIBUTED = [name for name, cls in BACKENDS.items() if cls.max_world_size is None]


def ranks(backend: str, wanted: int = 2) -> int:
    """`wanted` ranks, or fewer where the backend runs on fewer."""
    return min(wanted, BACKENDS[backend].max_world_size or wanted)


def with_options(backends: List[str] = DISTRIBUTED) -> List:
    """pytest params (backend, its option flags) for each Options example of each backend."""
    cases = []
    for backend in backends:
        for example in BACKENDS[backend].Options.examples():
            changed = "".join(f"-{name}{value}" for name, value in example.changed().items())
            cases.append(pytest.param(backend, example.to_flags(), id=f"{backend}{changed}"))
    return cases
