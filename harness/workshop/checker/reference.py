"""Property 2 of harness check: the ranks' weights are what one process trains on the same global
batches at the same LRs; where they are not, the usual mistakes are tried to name the cause."""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from ...study.scaling.equivalence import UPDATE_BOUND, update_differences, worst
from ...tasks.models import WorkshopCNN
from .. import exercise
from .observe import Observation
from .todos import Failure, Framework

CLIP_NORM = 1.0  # DeepSpeed's default gradient_clipping


def max_gap(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts, over `reference`'s tensors."""
    return max((weights[name].double() - value.double()).abs().max().item() for name, value in reference.items())


def _train_reference(
    start: dict[str, torch.Tensor],
    batches: list[list[list[int]]],
    lrs: list[float],
    optimizer: dict[str, Any],
    train_samples: Optional[int],
    gradients: Callable[[torch.nn.Module], None] = lambda model: None,
) -> dict[str, torch.Tensor]:
    """One process trained on the global batches at `lrs` from `start`; `batches` holds each step's
    batch of every rank, and `gradients` may change the gradients before each step (to try a
    suspected mistake).

    Each step's gradient is the global batch's mean loss differentiated as the ranks do it: each
    rank's batch forward and backward on its own, weighted by its share of the global batch. That is
    one process's gradient on the global batch, computed in the same float32 kernels as the ranks'.
    Computed in one piece instead, a convolution over 4 x 16 images rounds otherwise than over 16,
    and where the digits' upscaled pixels tie in a max-pooling window the rounding picks the other
    pixel: another valid gradient, 1e-3 apart in one step, 1e-2 of the update after ten (seen at 4
    ranks on an AVX-512 CPU)."""
    data = exercise.digits("train", train_samples)
    model = WorkshopCNN(dropout=0.0)
    model.load_state_dict(start)
    reference = getattr(torch.optim, optimizer["class"])(model.parameters(), lr=lrs[0], **optimizer["settings"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each launched rank computes (and they may still be exiting on few cores)
    try:
        for rank_batches, lr in zip(batches, lrs):
            for group in reference.param_groups:
                group["lr"] = lr
            reference.zero_grad()
            samples = sum(len(indices) for indices in rank_batches)
            for indices in filter(None, rank_batches):
                rows = torch.tensor(indices)
                loss = F.cross_entropy(model(data.images[rows]), data.labels[rows])
                (loss * (len(indices) / samples)).backward()
            gradients(model)
            reference.step()
    finally:
        torch.set_num_threads(threads)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def check_one_process(
    observations: list[Observation], framework: Framework, ranks: int, bound: float = UPDATE_BOUND
) -> list[Failure]:
    """Property 2, on rank 0's weights (the ranks agree): within `bound` of the update (UPDATE_BOUND;
    a mixed-precision run's is autocast.TOLERANCE)."""
    first = observations[0]
    if first.optimizer is None or not hasattr(torch.optim, first.optimizer["class"]):
        return [
            Failure(
                "one process",
                "the checker found no torch.optim optimizer stepping the model, so it cannot "
                "train the one-process reference",
                framework.sync_keys,
            )
        ]
    per_rank = [observation.step_batches() for observation in observations]
    batches = [[rank_batches[step] for rank_batches in per_rank] for step in range(len(first.steps))]
    lrs = [step[0] for step in first.steps]
    train_samples = first.args.get("train_samples") if first.args else None

    def distance(**mistake: Any) -> tuple[str, float]:
        trained = _train_reference(first.start, batches, lrs, first.optimizer, train_samples, **mistake)
        return worst(update_differences(first.final, trained, first.start))

    name, value = distance()
    if value <= bound:
        return []
    batch = sum(len(indices) for indices in batches[0])
    observed = (
        f"rank 0's weights differ from one process trained on the same {batch}-sample global batches at "
        f"the same LRs by {value:.3g} of the update (in {name}; at most {bound:g})"
    )

    return [_named_mistake(distance, observed, ranks, framework, bound)]


def _named_mistake(
    distance: Callable[..., tuple[str, float]], observed: str, ranks: int, framework: Framework, bound: float
) -> Failure:
    """Property 2's failure, naming the usual mistake when one process that makes it matches."""

    def scaled(model: torch.nn.Module) -> None:
        for parameter in model.parameters():
            parameter.grad.mul_(ranks)

    def clipped(model: torch.nn.Module) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)

    if distance(gradients=scaled)[1] <= bound:
        return Failure(
            "one process",
            f"{observed}; they match one process whose gradients are {ranks}x larger: "
            "the gradients are summed over the ranks, not averaged",
            framework.sync_keys,
        )
    if distance(gradients=clipped)[1] <= bound:
        return Failure(
            "one process",
            f"{observed}; they match one process that clips the gradient norm at "
            f"{CLIP_NORM:g} (DeepSpeed's default gradient_clipping): turn clipping off",
            framework.clip_keys,
        )
    keys = (
        framework.sync_keys + framework.clip_keys
        if framework.clip_keys != framework.sync_keys
        else framework.sync_keys
    )
    return Failure("one process", observed, keys)
