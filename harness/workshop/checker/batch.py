"""The batch an engine's config declares against the batch each rank trains on (DeepSpeed's).

DeepSpeed's train_batch_size is the global batch: train_micro_batch_size_per_gpu x
gradient_accumulation_steps x ranks. Each rank hands its backend's `watch_engine_config` the
config the script passes to deepspeed.initialize (a dict, or the path of a JSON file), and keeps
its batch settings (`batch_settings`). The judge completes them by DeepSpeed's own rule
(`resolve`) and compares them with the samples that fed each rank's optimizer step, or with
--batch-size where DeepSpeed refused them and the run stopped in deepspeed.initialize
(`check_global_batch`). A config the checker did not see is still recognised by DeepSpeed's
complaint about its batch settings (BATCH_COMPLAINT).
"""

from __future__ import annotations

import json
import numbers
import re
from typing import TYPE_CHECKING, Any, Optional

from .todos import Failure, Framework

if TYPE_CHECKING:
    from .observe import Observation

BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# DeepSpeed's assertions on them (deepspeed.runtime.config: "Check batch related parameters ...",
# "Gradient accumulation steps: 0 has to be greater than 0", "Micro batch size per gpu: ...").
BATCH_COMPLAINT = re.compile(r"train_batch_size|micro.?batch|gradient.?acc", re.I)


def batch_settings(config: Any) -> Optional[dict[str, int]]:
    """The batch settings of a DeepSpeed config (a dict, or a JSON file's path); None if the
    checker cannot read them as DeepSpeed would (an unreadable file, a value that is not a count)."""
    if isinstance(config, str):
        try:
            with open(config) as handle:
                config = json.load(handle)
        except (OSError, ValueError):
            return None
    if not isinstance(config, dict):
        return None
    settings = {key: config[key] for key in BATCH_KEYS if config.get(key) is not None}
    if not all(isinstance(value, numbers.Integral) and not isinstance(value, bool) for value in settings.values()):
        return None
    return {key: int(value) for key, value in settings.items()}


def resolve(settings: dict[str, int], ranks: int) -> Optional[tuple[int, int, int]]:
    """(global batch, micro-batch, accumulation steps) as DeepSpeed completes `settings` at `ranks`
    ranks (deepspeed.runtime.config's _set_batch_related_parameters), or None where it refuses them."""
    total, micro, steps = (settings.get(key) for key in BATCH_KEYS)
    if any(value <= 0 for value in settings.values()):
        return None
    if total is not None and micro is not None and steps is None:
        steps = total // micro // ranks
    elif total is not None and steps is not None and micro is None:
        micro = total // ranks // steps
    elif total is None and micro is not None:
        total = micro * (steps or 1) * ranks
    elif total is not None and micro is None:
        micro = total // ranks
    if total is None or micro is None:
        return None  # neither batch size given
    steps = 1 if steps is None else steps
    if min(total, micro, steps) <= 0 or total != micro * steps * ranks:
        return None
    return total, micro, steps


def _rank_batch(observation: Observation) -> Optional[int]:
    """The samples that fed each of the rank's optimizer steps (--batch-size before any step)."""
    batches = observation.step_batches()
    if batches and batches[0]:
        return len(batches[0])
    return (observation.args or {}).get("batch_size")


def check_global_batch(observations: list[Observation], ranks: int, framework: Framework) -> list[Failure]:
    """The engine's batch settings fit the batch each rank trains on."""
    for observation in observations:
        batch = _rank_batch(observation)
        for settings in observation.engine_configs:
            if settings is None or batch is None:
                continue
            resolved = resolve(settings, ranks)
            if resolved is not None and resolved[0] == batch * ranks and resolved[1] * resolved[2] == batch:
                continue
            given = ", ".join(f"{key} {value}" for key, value in settings.items()) or "no batch size"
            how = (
                "DeepSpeed refuses it (train_batch_size is not micro-batch x accumulation steps x ranks)"
                if resolved is None
                else f"DeepSpeed reads it as a global batch of {resolved[0]} ({resolved[1]} per rank x {resolved[2]} "
                f"accumulation steps x {ranks} ranks)"
            )
            per_rank = (
                f"train_micro_batch_size_per_gpu x gradient_accumulation_steps = {batch}"
                if settings.get("gradient_accumulation_steps", 1) > 1
                else f"train_micro_batch_size_per_gpu {batch}"
            )
            return [
                Failure(
                    "global batch",
                    f"rank {observation.rank} gave deepspeed.initialize a config with {given} "
                    f"at {ranks} ranks: {how}; each rank trains on {batch} samples a step, so "
                    f"train_batch_size must be the global batch {batch} x {ranks} = "
                    f"{batch * ranks} ({per_rank})",
                    framework.config_keys,
                )
            ]
    return []
