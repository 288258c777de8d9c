"""Which framework a script uses, and which TODO governs each property the checker judges.

A script's imports tell its framework, named by its backend in harness.backends' registry (whose
class gives the real launcher), the solution whose TODO blocks number its TODOs, and the TODO keys
(harness.workshop.exercise's convention) that govern the properties whose code differs between
frameworks. Its call of workshop.parse_args tells which of a step's own flags it takes
(`step_options`: --micro-batches, the resume flags, --precision), which the check then gives it. A Failure is one property that does not hold, with the keys of the TODOs behind it;
TodoIndex turns those keys into "TODO N of FILE: title", read from the solutions the exercises
are made from.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...backends import backend_class
from ...errors import UsageError
from .. import exercise

SOLUTIONS = Path(__file__).resolve().parents[3] / "solutions"


@dataclass(frozen=True)
class Failure:
    """A property that does not hold: what was observed, and the TODO keys that govern it (none:
    the line stands alone, as a framework's error outside every TODO)."""

    name: str
    observed: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Framework:
    """What a script's imports tell: its backend in the registry (how to launch it), which
    solution numbers its TODOs, and the TODO keys that govern the weights' properties."""

    backend: str
    imports: re.Pattern[str]
    solution: str
    start_keys: tuple[str, ...]  # every rank starts from rank 0's weights
    sync_keys: tuple[str, ...]  # the gradients are averaged over the ranks
    clip_keys: tuple[str, ...]  # gradient clipping
    device_keys: tuple[str, ...]  # each rank picks its GPU by its local rank
    config_keys: tuple[str, ...] = ()  # the engine's config (DeepSpeed's batch settings)
    accumulation_keys: tuple[str, ...] = ()  # micro-batches averaged once per step, by the framework's mechanism

    @property
    def launcher(self) -> str:
        """The launcher its ranks run under on one machine: its backend's own."""
        return backend_class(self.backend).local_launcher


FRAMEWORKS = (  # in the order they are recognised: DeepSpeed and FSDP scripts import torch.distributed too
    Framework(
        "deepspeed",
        re.compile(r"^\s*(import|from)\s+deepspeed\b", re.M),
        "04_deepspeed.py",
        ("initialize",),
        ("engine-step",),
        ("config",),
        ("process-group",),
        ("config",),
        accumulation_keys=("config", "engine-step"),
    ),
    Framework(
        "horovod",
        re.compile(r"^\s*(import|from)\s+horovod\b", re.M),
        "03_horovod.py",
        ("broadcast",),
        ("optimizer",),
        ("optimizer",),
        ("init",),
        accumulation_keys=("optimizer",),
    ),
    # An FSDP2 script imports torch.distributed too: recognised before DDP.
    Framework(
        "fsdp",
        re.compile(r"^\s*(import|from)\s+torch\.distributed\.fsdp\b", re.M),
        "06_fsdp.py",
        ("shard-model",),
        ("shard-model",),
        ("shard-model",),
        ("process-group",),
        accumulation_keys=("gradient-sync",),
    ),
    Framework(
        "ddp",
        re.compile(
            r"^\s*(import\s+torch\.(distributed|nn\.parallel)\b"
            r"|from\s+torch\.(distributed|nn\.parallel)\b"
            r"|from\s+torch\s+import\s+distributed\b)",
            re.M,
        ),
        "02_ddp.py",
        ("wrap",),
        ("wrap",),
        ("wrap",),
        ("process-group",),
        accumulation_keys=("no-sync",),
    ),
)
# The workshop.parse_args keywords that add a step's own flags, as a script passes them.
STEP_OPTIONS = re.compile(r"\b(accumulation|resume|precision|memory)\s*=\s*True\b")


def framework_of(source: str, path: str) -> Framework:
    """The framework a script's imports name; UsageError if none."""
    for framework in FRAMEWORKS:
        if framework.imports.search(source):
            return framework
    raise UsageError(
        f"{path} imports none of deepspeed, horovod, torch.distributed: harness check runs "
        "data-parallel scripts such as exercises/02_ddp.py (run a serial one with python)"
    )


def step_options(source: str) -> frozenset[str]:
    """The parse_args keywords a script turns on ("accumulation", "resume", "precision"): the flags
    of its step that it takes, and so that the check gives it."""
    return frozenset(match[1] for match in STEP_OPTIONS.finditer(source))


class TodoIndex:
    """TODO numbers and titles by key, read from the solutions the exercises are made from: the
    script's own step (by its file name), then its framework's solution, then any step that
    exercises the key (a step's own key, such as warmup, in a script named otherwise)."""

    def __init__(self, script_name: str, framework: Framework) -> None:
        self.framework = framework
        names = [script_name] if (SOLUTIONS / script_name).is_file() else []
        names += [framework.solution, *(path.name for path in sorted(SOLUTIONS.glob("*.py")))]
        self.solutions = list(dict.fromkeys(names))

    def describe(self, keys: Sequence[str]) -> str:
        """ "TODO 4 of 02_ddp.py: wrap the model ..." for each key, from the first solution that exercises it."""
        found = []
        for key in keys:
            for name in self.solutions:
                path = SOLUTIONS / name
                blocks = exercise.todo_blocks(path.read_text(), name) if path.is_file() else []
                block = next((block for block in blocks if block.key == key and block.number is not None), None)
                if block is not None:
                    found.append(f"TODO {block.number} of {name}: {block.title}")
                    break
            else:
                found.append(f"the TODO({key}) block of {self.framework.solution}")
        return "; ".join(found)
