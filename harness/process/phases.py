"""The phases of a run, named once: the one vocabulary of the loop, the step timer, the heartbeat,
the profiler and the record.

The training loop says which phase it enters (harness.training.phases.PhaseLog.enter), once per
phase; each listener takes from the phase what it needs: the heartbeat its `label` (what a
survivor says of a stuck rank), the profiler its `region` (the trace's annotation, "harness:
forward"), the step timer its `column` (the record's step breakdown). A step is DATA, then for each
micro-batch FORWARD and BACKWARD, then GRADIENT_SYNC, OPTIMIZER and BOOKKEEPING; the run's other
phases come between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Phase:
    """One phase: its words for a heartbeat, a profiler region and the step breakdown."""

    label: str  # how the heartbeat names it: "rank 1 (..., step 12, forward/backward, ...)"
    column: Optional[str] = None  # its column in the record's step_breakdown (steps only)
    region: Optional[str] = None  # its region in a --profile-trace, REGION_PREFIX + region


START = Phase("start-up")
DATA = Phase("data", column="data_wait")
FORWARD = Phase("forward/backward", column="forward_backward", region="forward")
BACKWARD = Phase("forward/backward", column="forward_backward", region="backward")
# Where a backend that only starts its allreduces in backward (Horovod) waits for them; in the
# breakdown it is part of forward_backward, less the communication exposed in it.
GRADIENT_SYNC = Phase("gradient sync", column="forward_backward", region="gradient sync")
OPTIMIZER = Phase("optimizer", column="optimizer", region="optimizer")
BOOKKEEPING = Phase("bookkeeping (loss sums, callbacks)", column="other")
VOTE = Phase("preemption vote (all_reduce)", column="other")
CHECKPOINT = Phase("checkpoint")
EPOCH_END = Phase("epoch end (barrier, all_reduce of losses)")
EVALUATION = Phase("evaluation")
FINISH = Phase("finish (all_reduce of timings)")

PHASES = (
    START,
    DATA,
    FORWARD,
    BACKWARD,
    GRADIENT_SYNC,
    OPTIMIZER,
    BOOKKEEPING,
    VOTE,
    CHECKPOINT,
    EPOCH_END,
    EVALUATION,
    FINISH,
)
# The step breakdown's columns, in the order of a step: the phases' own, and the time any of them
# spent blocked on a collective (taken out of the phase it happened in), and what is left.
COMMUNICATION = "communication"
STEP_COLUMNS = ("data_wait", "forward_backward", COMMUNICATION, "optimizer", "other")
# A traced step's spans (its timeline): the step's columns but what is left.
TRACE_COLUMNS = STEP_COLUMNS[:-1]
REGION_PREFIX = "harness: "
# Each profiler region the loop opens, by its full name in a trace.
REGIONS = {REGION_PREFIX + phase.region: phase.region for phase in PHASES if phase.region}
