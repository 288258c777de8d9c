"""Property 3 of harness check: the learning rate, against the rule notebook 02's runs support.

The workshop teaches one rule, RULE, worded the same in notebook 02, the exercises' hints, this
checker, WORKSHOP.md and the docs (tests/unit/test_lr_rule.py finds it in each). Notebook 02 trains
the global batch 256 against one worker's 16 (16 ranks) with Adam and with SGD, each scaling rule
without and with a warmup, at 3 seeds, all on the same constant-after-warmup schedule, and compares
each run's final training loss with the rule's run, paired by seed (95% intervals). A rule whose run
it resolved worse is rejected; every other one it could not reject, and the check accepts it too:
ACCEPTED is what the notebook's cell that calls harness.workshop.accepted_rules prints, and asserts
(the test holds the committed output and ACCEPTED together).

A script's LR is judged step by step (`check_lr`): it must be --lr scaled to the global batch of
`ranks` processes' batches by an accepted rule, constant, or, when the script takes --warmup-epochs,
climbing linearly per step from --lr at step 0 to that at step round(--warmup-epochs x steps per epoch),
then constant (step 5's text).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ...training.lr import learning_rate, scaled_lr
from .todos import Failure

if TYPE_CHECKING:
    from .observe import Observation

RULE = (
    "multiply the one-process learning rate by the square root of the number of ranks, and warm it up "
    "to that per step from the one-process rate over the first epoch"
)
# Notebook 02's optimizers: Adam stands for the adaptive ones (each weight's step divided by its own
# gradient's running size), SGD for every other.
ADAPTIVE_OPTIMIZERS = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop"})
# (notebook 02's optimizer, whether the script warms up) -> the scaling rules its runs did not reject,
# the rule's own first (harness.training.lr's names).
ACCEPTED: dict[tuple[str, bool], tuple[str, ...]] = {
    ("adam", False): ("sqrt",),
    ("adam", True): ("sqrt",),
    ("sgd", False): ("sqrt", "none", "linear"),
    ("sgd", True): ("sqrt", "none", "linear"),
}
_NAMES = {"none": "no scaling", "sqrt": "the square-root rule", "linear": "the linear rule"}


def optimizer_family(optimizer: Optional[dict[str, Any]]) -> str:
    """'adam' for an adaptive optimizer (ADAPTIVE_OPTIMIZERS), 'sgd' for any other (or none seen)."""
    return "adam" if optimizer and optimizer["class"] in ADAPTIVE_OPTIMIZERS else "sgd"


def lr_rules(optimizer: Optional[dict[str, Any]], warms_up: bool) -> tuple[str, ...]:
    """The LR scaling rules the exercise accepts for this optimizer (observe's spec: its class): those
    notebook 02's runs could not reject (ACCEPTED), the rule's own first."""
    return ACCEPTED[(optimizer_family(optimizer), warms_up)]


def _lr_of(rule: str, base: float, ranks: int) -> str:
    if rule == "none":
        return f"--lr {base:.4g}"
    factor = f"sqrt({ranks})" if rule == "sqrt" else str(ranks)
    return f"--lr x {factor} = {scaled_lr(base, ranks, 1, rule):.4g}"


def rule_text(optimizer: Optional[dict[str, Any]], ranks: int, base: float, warms_up: bool) -> str:
    """What the LR should have been: the rule, and what else notebook 02 could not reject for this optimizer."""
    name = optimizer["class"] if optimizer else "its optimizer"
    reached = "reached by the warmup" if warms_up else "from the first step, without a warmup"
    text = f"notebook 02's rule: {RULE} ({_lr_of('sqrt', base, ranks)}, {reached})"
    others = [rule for rule in lr_rules(optimizer, warms_up) if rule != "sqrt"]
    if not others:
        return f"{text}; for {name} its runs rejected the other rules"
    accepted = " and ".join(f"{_NAMES[rule]} ({_lr_of(rule, base, ranks)})" for rule in others)
    return f"{text}; for {name} its runs could not reject {accepted}, so the check accepts them too"


def check_lr(observations: list[Observation], ranks: int) -> list[Failure]:
    """Property 3, step by step against each accepted rule (warmup from --lr at step 0): nothing if one
    matches; else the failures of the first accepted rule that the last step reached (a wrong warmup),
    or of the rule."""
    first = observations[0]
    if not first.args or "lr" not in first.args:
        return [
            Failure(
                "learning rate",
                "the script did not read its flags with workshop.parse_args, so the checker cannot tell its --lr",
                ("lr",),
            )
        ]
    verdicts = [
        _lr_failures(observations, ranks, rule) for rule in lr_rules(first.optimizer, _warmup_steps(first) > 0)
    ]
    if all(verdicts):
        return next((failures for failures in verdicts if failures[0].keys == ("warmup",)), verdicts[0])
    return []


def _lr_failures(observations: list[Observation], ranks: int, rule: str) -> list[Failure]:
    """Property 3 against one scaling rule."""
    first = observations[0]
    base = first.args["lr"]
    target = scaled_lr(base, ranks, 1, rule)  # the global batch is `ranks` processes' batches
    warmup = _warmup_steps(first)
    expected = [
        learning_rate(
            step, base_lr=base, peak_lr=target, warmup_steps=warmup, total_steps=len(first.steps), schedule="constant"
        )
        for step in range(len(first.steps))
    ]
    for observation in observations:
        for step, (used, wanted) in enumerate(zip(observation.steps, expected)):
            lr = used[0]
            if abs(lr - wanted) <= 1e-6 * abs(wanted):
                continue
            if not warmup or abs(observation.steps[-1][0] - target) > 1e-6 * target:
                return [
                    Failure(
                        "learning rate",
                        f"rank {observation.rank} used LR {lr:g} at step {step + 1} "
                        f"(--lr {base:g}); {rule_text(first.optimizer, ranks, base, warmup > 0)}",
                        ("lr",),
                    )
                ]
            return [
                Failure(
                    "learning rate",
                    f"rank {observation.rank} used LR {lr:g} at step {step + 1}; the "
                    f"warmup must climb linearly from --lr {base:g} at step 1 to "
                    f"{target:.4g} at step {warmup + 1} ({warmup} steps later), then stay "
                    f"there: step {step + 1} trains at {wanted:.4g}",
                    ("warmup",),
                )
            ]
    return []


def _steps_in_first_epoch(observation: Observation) -> int:
    first_pass = next((number for split, number, _, _ in observation.fetches if split == "train"), None)
    return len(
        {
            step
            for split, number, step, _ in observation.fetches
            if split == "train" and number == first_pass and step < len(observation.steps)
        }
    )


def _warmup_steps(observation: Observation) -> int:
    return round((observation.args.get("warmup_epochs") or 0) * _steps_in_first_epoch(observation))
