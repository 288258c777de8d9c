"""Learning-rate rules as pure functions of the step.

The training loop calls `learning_rate` before every step and writes the value into the optimizer,
identically for every backend; no framework scheduler is used (DeepSpeed's would override it).

The rule (Goyal et al., "Accurate, Large Minibatch SGD", 2017):
  * `base_lr` is the LR tuned for `base_batch` samples per step;
  * the global batch scales it: linear (k times the batch, k times the LR), sqrt, or none;
  * warmup ramps linearly per step from `base_lr` to the scaled LR, avoiding the early
    instability of a large LR;
  * after warmup a schedule (constant, step decay, cosine) shapes the rest of training.
"""

from __future__ import annotations

import math

SCALING_RULES = ("none", "linear", "sqrt")
SCHEDULES = ("constant", "step", "cosine")
STEP_DECAY_AT = (0.5, 0.75)  # fractions of the post-warmup steps where the step schedule divides by 10
STEP_DECAY_FACTOR = 0.1


def scaled_lr(base_lr: float, global_batch: int, base_batch: int, rule: str) -> float:
    """The peak LR for `global_batch` given `base_lr` tuned for `base_batch`."""
    ratio = global_batch / base_batch
    if rule == "none":
        return base_lr
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    raise ValueError(f"unknown LR scaling rule {rule!r}; choose one of {', '.join(SCALING_RULES)}")


def learning_rate(
    step: int, *, base_lr: float, peak_lr: float, warmup_steps: int, total_steps: int, schedule: str
) -> float:
    """LR for 0-based optimizer step `step` of `total_steps`."""
    if step < warmup_steps:
        # Ramp so that step 0 uses base_lr and step `warmup_steps` reaches peak_lr.
        return base_lr + (peak_lr - base_lr) * step / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "constant":
        return peak_lr
    if schedule == "step":
        return peak_lr * STEP_DECAY_FACTOR ** sum(progress >= mark for mark in STEP_DECAY_AT)
    if schedule == "cosine":
        return 0.5 * peak_lr * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown LR schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
