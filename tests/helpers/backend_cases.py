"""The registered backends as the contract tests run them, read from harness.backends' registry.

A backend registered there joins every test that parametrises over these (equivalence with one
process, preemption and exact resume, a dead or hung rank, precision, the demo) with no test
edit; what differs between backends comes from the backend class (its launcher, its rank limit,
its Options examples), never from an `if` on its name.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

from harness.backends import BACKENDS, get_backend
from harness.errors import EXIT_PREEMPTED, UsageError

ALL = list(BACKENDS)
# Backends that run on any number of ranks (the single-process baseline runs on one).
DISTRIBUTED = [name for name, cls in BACKENDS.items() if cls.max_world_size is None]


def ranks(backend: str, wanted: int = 2) -> int:
    """`wanted` ranks, or fewer where the backend runs on fewer."""
    return min(wanted, BACKENDS[backend].max_world_size or wanted)


def with_options(backends: list[str] = DISTRIBUTED, turns: Optional[LauncherTurns] = None) -> list:
    """pytest params (backend, its option flags) for each Options example of each backend; with
    `turns`, (backend, flags, launcher), the launcher taken in turn."""
    cases = []
    for backend in backends:
        for example in BACKENDS[backend].Options.examples():
            changed = "".join(f"-{name}{value}" for name, value in example.changed().items())
            if turns is None:
                cases.append(pytest.param(backend, example.to_flags(), id=f"{backend}{changed}"))
            else:
                launcher = turns.next(backend)
                cases.append(pytest.param(backend, example.to_flags(), launcher, id=f"{backend}{changed}-{launcher}"))
    return cases


def for_unused_parameters(backend: str, flags: list[str]) -> list[str]:
    """`flags` and the switch `backend` asks for before it trains a model whose loss leaves some
    parameters without a gradient in some steps (DDP's --ddp-find-unused-parameters), as the backend
    itself answers it (Backend.check_unused_parameters): none where it trains such a model as it is."""
    cls = BACKENDS[backend]

    def accepts(options: dict[str, bool]) -> bool:
        try:
            get_backend(backend, options).check_unused_parameters(["unused.weight"])
        except UsageError:
            return False
        return True

    if accepts({}):
        return flags
    switches = [spec.name for spec in dataclasses.fields(cls.Options) if spec.default is False]
    switch = next(name for name in switches if accepts({name: True}))
    return [*flags, cls.Options.flag(switch)]


def launcher_pairs(backends: list[str] = ALL) -> list[tuple[str, str]]:
    """Every (backend, launcher) pair the backends run under on one machine, as they declare it."""
    return [(backend, launcher) for backend in backends for launcher in BACKENDS[backend].local_launchers]


# What a launcher reports when its ranks exit with EXIT_PREEMPTED (measured): a plain process, mpirun
# and the deepspeed launcher pass the ranks' status on; torchrun and horovodrun report any failed
# worker as 1.
PREEMPTED_STATUS = {
    "python": EXIT_PREEMPTED,
    "mpirun": EXIT_PREEMPTED,
    "deepspeed": EXIT_PREEMPTED,
    "torchrun": 1,
    "horovodrun": 1,
}


class LauncherTurns:
    """Hands out each backend's launchers in turn, its own launcher first, so that the runs of a
    test module together cover every (backend, launcher) pair without one more run per pair."""

    def __init__(self) -> None:
        self.given: dict[str, int] = {}
        self.used: set[tuple[str, str]] = set()

    def next(self, backend: str) -> str:
        cls = BACKENDS[backend]
        launchers = [cls.local_launcher, *(name for name in cls.local_launchers if name != cls.local_launcher)]
        turn = self.given.get(backend, 0)
        self.given[backend] = turn + 1
        launcher = launchers[turn % len(launchers)]
        self.used.add((backend, launcher))
        return launcher

    def cases(self, backends: list[str]) -> list:
        """pytest params (backend, launcher), one per backend."""
        params = []
        for backend in backends:
            launcher = self.next(backend)
            params.append(pytest.param(backend, launcher, id=f"{backend}-{launcher}"))
        return params
