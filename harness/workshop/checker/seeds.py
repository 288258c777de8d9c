"""Property 9 of harness check: the ranks draw their dropout masks from random states of their own.

The exercises' CNN drops units at random in training (its default dropout; the check turns it off
so that the weights can be compared with one process). Every rank is seeded alike so that the
weights start alike; if it stays so, every rank draws the same masks and drops the same units at the
same place of its batch, where one process on the global batch gives every sample a draw of its
own. In each rank (observe) the state of the generator the first training forward draws from, on
the device of its input, is kept as a digest; judged, no two ranks may share one.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Optional

import torch

from .todos import Failure, Framework

if TYPE_CHECKING:
    from .observe import Observation


def random_state(device: torch.device) -> Optional[str]:
    """A digest of the state of torch's default generator on `device` (None for a device whose
    state torch does not expose here)."""
    if device.type == "cpu":
        state = torch.get_rng_state()
    elif device.type == "cuda":
        state = torch.cuda.get_rng_state(device)
    else:
        return None
    return hashlib.sha256(state.numpy().tobytes()).hexdigest()


def check_rank_seeds(observations: list[Observation], framework: Framework) -> list[Failure]:
    """Property 9: no two ranks started training from the same random state."""
    alike: dict[str, list[int]] = {}
    for observation in observations:
        if observation.random_state is not None:
            alike.setdefault(observation.random_state, []).append(observation.rank)
    shared = next((ranks for ranks in alike.values() if len(ranks) > 1), None)
    if shared is None:
        return []
    who = "every rank" if len(shared) == len(observations) else f"ranks {', '.join(map(str, shared))}"
    return [
        Failure(
            "rank seeds",
            f"{who} started training from the same random state, so with dropout on they draw the same "
            "dropout masks, dropping the same units at the same place of their batches: once the weights "
            "are shared, seed each rank again from --seed and its rank",
            framework.start_keys,
        )
    ]
