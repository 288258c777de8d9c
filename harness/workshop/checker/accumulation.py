"""Property 10 of harness check: gradient accumulation communicates once per optimizer step.

A script that splits each step's batch into micro-batches (steps 3, 4, 6 and 7, run with
--micro-batches) runs a backward per micro-batch. The gradients only need averaging over the ranks
once, after the last, and every framework has its own way to say so (`MECHANISMS`): DDP's no_sync,
Horovod's backward_passes_per_step, DeepSpeed's gradient_accumulation_steps, FSDP2's
set_requires_gradient_sync. Each rank counts, per counted optimizer step, its training forwards and
how many of their backward passes communicated (observe), through its framework's backend
(`watch_gradient_syncs`): DDP's buckets through a comm hook, the allreduces Horovod's
DistributedOptimizer starts, the averaging a DeepSpeed engine does at a gradient accumulation
boundary, FSDP2's reduce-scatters. The math is the same either way, so only this count shows the
extra communication. Horovod refuses it outright: left at one backward pass per step, its optimizer
stops the second backward with an AssertionError, which `stopped_accumulating` turns into this
property's line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .todos import Failure, Framework

if TYPE_CHECKING:
    from .observe import Observation


@dataclass(frozen=True)
class Mechanism:
    """A framework's way to average the gradients once per step of micro-batches: its name, what
    the script must do, and the error the framework itself stops a script with where it refuses
    to average more often (None: it does not refuse)."""

    name: str
    fix: str
    refusal: Optional[re.Pattern[str]] = None


MECHANISMS = {  # by backend name (todos.Framework.backend)
    "ddp": Mechanism(
        "DDP's no_sync",
        "run the forward and backward of every micro-batch but the last inside the DDP model's no_sync()",
    ),
    "horovod": Mechanism(
        "Horovod's backward_passes_per_step",
        "give hvd.DistributedOptimizer backward_passes_per_step=args.micro_batches: it then allreduces "
        "in the last backward pass of a step only",
        # horovod/torch/optimizer.py, the hook of a gradient computed again before step()
        re.compile(r"computed more than backward_passes_per_step times"),
    ),
    "deepspeed": Mechanism(
        "DeepSpeed's gradient_accumulation_steps",
        "set the config's gradient_accumulation_steps to args.micro_batches (train_micro_batch_size_per_gpu "
        "one micro-batch) and call engine.backward and engine.step on every micro-batch: the engine then "
        "averages on the last one only",
    ),
    "fsdp": Mechanism(
        "FSDP2's set_requires_gradient_sync",
        "call the sharded model's set_requires_gradient_sync(False) before every micro-batch but the last, "
        "and set_requires_gradient_sync(True) before the last: it then reduce-scatters once",
    ),
}


def accumulates(observations: list[Observation]) -> bool:
    """Whether a rank was seen running more than one training forward in an optimizer step."""
    return any(passes > 1 for observation in observations for _, passes in observation.gradient_syncs)


def averaged_once(observations: list[Observation]) -> bool:
    """Whether every rank was seen communicating in exactly one backward pass of every step, and
    ran more than one in some (what the PASS line may claim)."""
    return accumulates(observations) and all(
        synced == 1 for observation in observations for synced, _ in observation.gradient_syncs
    )


def check_accumulation(observations: list[Observation], framework: Framework) -> list[Failure]:
    """Property 10: no optimizer step of any rank communicated in more than one backward pass."""
    mechanism = MECHANISMS[framework.backend]
    for observation in observations:
        for step, (synced, passes) in enumerate(observation.gradient_syncs, 1):
            if synced > 1:
                return [
                    Failure(
                        "accumulation",
                        f"rank {observation.rank} averaged the gradients over the ranks in {synced} of the "
                        f"{passes} backward passes of step {step}, where once per step gives the same "
                        f"gradients: {mechanism.fix}",
                        framework.accumulation_keys,
                    )
                ]
    return []


def stopped_accumulating(rank: int, message: str, framework: Framework) -> Optional[Failure]:
    """Property 10's line for a run that rank `rank` stopped with `message`, where that is the
    framework refusing to average the gradients in more than one backward pass of a step."""
    mechanism = MECHANISMS[framework.backend]
    if mechanism.refusal is None or not mechanism.refusal.search(message):
        return None
    return Failure(
        "accumulation",
        f'rank {rank} stopped with "{message.strip()}": the framework counted more backward passes in a '
        f"step than {mechanism.name} told it to expect; {mechanism.fix}",
        framework.accumulation_keys,
    )
