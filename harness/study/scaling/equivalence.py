"""When do two trainings count as the same? The bound the tests and `harness check` use.

N ranks with batch b must train the weights of one process with batch N b: the same samples, the
mean of the same gradients, the same LR. Exactly equal they are not: float32 rounding depends on
the summation order, which changes with the batch split, and training amplifies it. So weights are
compared relative to how far training moved them, per tensor:

    ||w - w_ref|| / ||w_ref - w_0||

Measured on the workshop CNN, digits, batch 2 x 16 against 1 x 32, after 10 steps (SGD, lr 0.05,
momentum 0.9, dropout off), identical for DDP, Horovod, DeepSpeed ZeRO 0-3 and FSDP: 3.3e-6 (Adam 2.4e-6;
gradient accumulation 2 x 8 per rank 3.3e-6). The mistakes a data-parallel program makes land far
away: DeepSpeed's default gradient clipping at norm 1.0 0.68, a learning rate scaled 2x 4.9, the
gradient summed instead of averaged the same as 2x. UPDATE_BOUND = 1e-3 sits 300x above the
rounding and 680x below the smallest mistake. After 20 steps the same rounding had grown to 2.4e-4,
on one machine to 5.5e-5 in absolute terms while another stayed below 1e-5: so checks run
EQUIVALENCE_STEPS = 10 steps, where rounding cannot reach the bound on any CPU.

bf16 autocast rounds every product to 8 significant bits: the batch split changes which values are
rounded together, and 1 x 32 and 2 x 16 then differ by 3.8% of the update after 10 steps (3.0% after
5), the same for every backend. BF16_UPDATE_BOUND = 0.15 sits 4x above that and 4.5x below the
smallest mistake (clipping: 0.68); the backends, which split the batch alike, must still agree with
each other within UPDATE_BOUND.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

EQUIVALENCE_STEPS = 10
UPDATE_BOUND = 1e-3
BF16_UPDATE_BOUND = 0.15


def update_differences(
    weights: Mapping[str, torch.Tensor], reference: Mapping[str, torch.Tensor], initial: Mapping[str, torch.Tensor]
) -> dict[str, float]:
    """Per tensor of `reference`: ||weights - reference|| / ||reference - initial||.

    `initial` holds the weights both trainings started from. A tensor training did not move (norm
    of the update 0) counts as its absolute difference. Raises KeyError for a missing tensor.
    """
    differences = {}
    for name, target in reference.items():
        target = target.detach().double().cpu()
        gap = (weights[name].detach().double().cpu() - target).norm().item()
        update = (target - initial[name].detach().double().cpu()).norm().item()
        differences[name] = gap / update if update > 0 else gap
    return differences


def worst(differences: Mapping[str, float]) -> tuple:
    """(tensor name, value) of the largest difference."""
    name = max(differences, key=differences.get)
    return name, differences[name]
