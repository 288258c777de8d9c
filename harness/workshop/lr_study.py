"""Notebook 02's learning-rate study: one-process runs trained side by side, and what their seeds resolve.

Every run of the study is one process (notebook 01: N ranks with batch b train what one process with
batch N·b trains), so the runs are independent programs: `train_side_by_side` trains them a few at a
time, each in a process of its own with the threads its config asks for (one), so that two cores run
two at once. The seeds are the repeats: `compare` pairs two runs seed by seed (the same initial
weights and data order) and gives the 95% interval of their ratio (harness.study.scaling.intervals'
`ratio_interval`, Student's t on the log ratios; none below 3 seeds); `verdict` says what it resolves;
`accepted_rules` turns the verdicts against the rule into the scaling rules the evidence cannot reject,
for a script without and with a warmup (what `harness check` accepts: checker.lr.ACCEPTED).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Hashable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Optional, TypeVar

from ..study.scaling.intervals import Interval, ratio_interval

Key = TypeVar("Key", bound=Hashable)
Runs = Mapping[int, Mapping[str, Any]]  # seed -> the record of that seed's run

HIGHER, LOWER, UNRESOLVED = "higher", "lower", "not resolved"
RULE = "the rule"  # the verdict of the run the others are compared with


def train_side_by_side(configs: Mapping[Key, Any], processes: int = 2) -> dict[Key, dict[str, Any]]:
    """harness.train(config) for every TrainConfig in `configs`, `processes` at a time, each in a fresh
    process; the records under the same keys. Spawned, not forked: a fork of a notebook's kernel would
    carry its threads along. A run's record is the same as in the kernel (same config, same numbers)."""
    from ..training.loop import train  # what harness.train runs

    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=processes, mp_context=context) as pool:
        futures = {key: pool.submit(train, config) for key, config in configs.items()}
        return {key: future.result() for key, future in futures.items()}


def final_loss(record: Mapping[str, Any]) -> float:
    """The run's training loss over its last epoch (the mean of that epoch's steps)."""
    return float(record["train_loss"])


def compare(runs: Runs, against: Runs, value: Callable[[Mapping[str, Any]], float] = final_loss) -> Optional[Interval]:
    """The 95% interval of `value` of `runs` over that of `against`, paired by seed (ratio_interval);
    None below 3 shared seeds."""
    return ratio_interval(
        {seed: value(r) for seed, r in runs.items()}, {seed: value(r) for seed, r in against.items()}
    )


def verdict(interval: Optional[Interval]) -> str:
    """HIGHER or LOWER where the interval of a ratio excludes 1, UNRESOLVED where it holds 1 (or is missing)."""
    if interval is not None and interval[0] > 1:
        return HIGHER
    if interval is not None and interval[1] < 1:
        return LOWER
    return UNRESOLVED


def accepted_rules(variants: Mapping[str, Mapping[str, Any]], verdicts: Mapping[str, str]) -> dict[bool, list[str]]:
    """Per warmup (False: a script without one, True: with one), the LR scaling rules (harness.training.lr's
    names) of the runs in `variants` (name -> its lr_scaling and warmup_epochs) whose loss `verdicts` (name ->
    `verdict` against the rule's run) did not resolve HIGHER. Without scaling a warmup ramps from --lr to
    --lr, no ramp at all, so the unscaled run stands for both. The rule's own (verdict RULE) comes first."""
    accepted: dict[bool, list[str]] = {False: [], True: []}
    for name, settings in variants.items():
        rule = settings["lr_scaling"]
        warms_up = settings.get("warmup_epochs", 0) > 0
        if verdicts[name] == HIGHER:
            continue
        for warmup in (False, True) if rule == "none" else (warms_up,):
            if rule not in accepted[warmup]:
                accepted[warmup].append(rule)
    first = [settings["lr_scaling"] for name, settings in variants.items() if verdicts[name] == RULE]
    return {warmup: sorted(rules, key=lambda rule: rule not in first) for warmup, rules in accepted.items()}
