"""Property 13, for a step that takes the model's size (parse_args(memory=True), step 6): its script
trains once more, on a model too large for a whole copy of its training state per rank within the
memory the check allows each rank, and must finish there. Sharded layer by layer it does; a model
left whole on every rank, or sharded only as one unit (whose weights and gradients are then all
gathered at once), runs out.

The budget is memory beyond what the rank holds before the script starts (Python and torch), set
as --memory-cap sets it (harness.process.memory_cap). It was measured on the CPU, where the run
takes place on any machine (its GPUs hidden), with SGD's momentum, at MEMORY_RANKS ranks.
"""

from __future__ import annotations

import torch

from ...process.memory_cap import OUT_OF_MEMORY
from ...tasks.models import WorkshopCNN
from .todos import Failure

WIDTH, HIDDEN_LAYERS = 1536, 24  # 70.9M parameters: 270 MiB of weights
# One epoch of one step at MEMORY_RANKS ranks of 16: the memory is a step's, an evaluation's and the
# saving's, not the epochs'. One micro-batch: FSDP keeps whole gradients between micro-batches.
MEMORY_FLAGS = ("--width", str(WIDTH), "--hidden-layers", str(HIDDEN_LAYERS))
MEMORY_FLAGS += ("--epochs", "1", "--train-samples", "64", "--micro-batches", "1")
# At 2 ranks sharding saves half of the training state, and rank 0's whole copy of the weights for
# saving them takes back more than that; at 4 ranks three quarters, which leaves room for it.
MEMORY_RANKS = 4
# Measured with the solution (per layer) and with only the root sharded, at 4 ranks on the CPU, each
# budget in one check: per layer it ran out at 650 MiB (saving) and trained at 700; the root alone
# ran out at 900 (in evaluation's forward, gathering the whole model) and trained at 1,050.
MEMORY_BUDGET_MIB = 800.0


def model_parameters() -> int:
    """The parameters of the model the memory run trains."""
    with torch.device("meta"):
        return sum(p.numel() for p in WorkshopCNN(width=WIDTH, hidden_layers=HIDDEN_LAYERS).parameters())


def _model() -> str:
    parameters = model_parameters()
    whole = 3 * 4 * parameters / 2**20  # float32 weights, gradients and SGD's momentum
    return (
        f"a model of {parameters / 1e6:.1f}M parameters at {MEMORY_RANKS} ranks ({' '.join(MEMORY_FLAGS[:4])}: "
        f"{whole:,.0f} MiB of weights, gradients and momentum whole)"
    )


def memory_failure(stopped: Failure) -> Failure:
    """The line of a memory run that did not finish: the TODO that shards the model where a rank ran
    out of its budget, else what stopped it."""
    if OUT_OF_MEMORY.search(stopped.observed):
        return Failure(
            "memory",
            f"{_model()} did not fit in {MEMORY_BUDGET_MIB:,.0f} MiB a rank: {stopped.observed}; each layer "
            "sharded on its own is gathered whole only while it computes",
            ("shard-model",),
        )
    return Failure("memory", f"the run on {_model()} did not finish: {stopped.observed}", stopped.keys)


def memory_line() -> str:
    """What the PASS line adds for a step whose memory run finished."""
    return f"; {_model()} trained within {MEMORY_BUDGET_MIB:,.0f} MiB a rank"
