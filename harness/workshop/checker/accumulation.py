"""Property 10 of harness check: gradient accumulation communicates once per optimizer step.

A script that splits each step's batch into micro-batches (step 7) runs a backward per micro-batch.
The gradients only need averaging over the ranks once, after the last: DDP's no_sync context keeps
the others local. Where the script's framework lets its gradient communications be watched (the
backend's `watch_gradient_syncs`: DDP's buckets through a comm hook), each rank counts, per counted
optimizer step, its training forwards and how many of their backward passes communicated (observe).
The math is the same either way, so only this count shows the extra allreduces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .todos import Failure

if TYPE_CHECKING:
    from .observe import Observation

KEYS = ("no-sync",)


def accumulates(observations: list[Observation]) -> bool:
    """Whether a rank was seen running more than one training forward in an optimizer step."""
    return any(passes > 1 for observation in observations for _, passes in observation.gradient_syncs)


def check_accumulation(observations: list[Observation]) -> list[Failure]:
    """Property 10: no optimizer step of any rank communicated in more than one backward pass."""
    for observation in observations:
        for step, (synced, passes) in enumerate(observation.gradient_syncs, 1):
            if synced > 1:
                return [
                    Failure(
                        "accumulation",
                        f"rank {observation.rank} averaged the gradients over the ranks in {synced} of the "
                        f"{passes} backward passes of step {step}, where once per step gives the same "
                        "gradients: run the forward and backward of every micro-batch but the last inside "
                        "the DDP model's no_sync()",
                        KEYS,
                    )
                ]
    return []
