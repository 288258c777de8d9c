"""Where the loop says which phase it is in, once per phase; the step timer, the heartbeat and the
profiler follow (the phases themselves: harness.process.phases).

Each listener does with a phase what its job needs: the heartbeat sends its label (so a survivor
can say where a stuck rank was), the profiler opens its region until the next phase (so a
--profile-trace tells forward, backward and optimizer apart under every backend), and the step
timer marks the step's instants (harness.training.timing): waiting for data from DATA, data ready
at the step's first FORWARD, gradients averaged at OPTIMIZER, the step done at BOOKKEEPING.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..process.heartbeat import Heartbeat
from ..process.phases import REGION_PREFIX, Phase
from .timing import StepTimer


class PhaseLog:
    """The loop's one call per phase, `enter(phase, step)`, handed to every listener."""

    def __init__(self, timer: StepTimer, heartbeat: Heartbeat) -> None:
        self.timer, self.heartbeat = timer, heartbeat
        self._region: Optional[Any] = None  # the profiler region of the current phase, open

    def enter(self, phase: Phase, step: int) -> None:
        """This rank now works on `phase` of optimizer step `step` (1-based)."""
        self.timer.enter(phase)
        self.heartbeat.beat(step, phase.label)
        if self._region is not None:
            self._region.__exit__(None, None, None)
            self._region = None
        if phase.region is not None:
            # About a microsecond when no profiler runs.
            self._region = torch.profiler.record_function(REGION_PREFIX + phase.region)
            self._region.__enter__()
