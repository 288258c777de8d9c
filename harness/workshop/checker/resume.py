"""Property 12 of harness check: a run stopped after an epoch and resumed ends as if never stopped.

Step 8 takes --checkpoint, --resume and --stop-after (workshop.parse_args(..., resume=True)). Its
check runs it three times under its launcher, with the check's flags each time: straight through
(the run that properties 1-11 judge), then with `--stop-after 1` and a --checkpoint that every rank
reads (a path in the check's directory: on a cluster the ranks share their working directory),
then with `--resume` from that checkpoint (`resume_flags`). The resumed run must end with the
uninterrupted run's weights, within UPDATE_BOUND of the last epoch's update (on a CPU they are
equal, bit for bit, as the harness's own resumes are). On the way, what differs is named, each
once, from what every rank of the three runs was seen doing (observe):
- the epochs: the resumed run trains those after the checkpoint's, not from the first again;
- the weights it starts from: those the stopped run ended with;
- its optimizer's state before its first step: the stopped run's after its last (SGD's momentum);
- the samples of each of its epochs, in order: those of the uninterrupted run's same epoch (the
  sampler deals an epoch's order from the seed and the epoch it is told);
- the random state its first training forward draws from: the uninterrupted run's at that epoch
  (dropout draws its masks from it; the check runs without dropout, so only the state shows it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...study.scaling.equivalence import UPDATE_BOUND, update_differences, worst
from .reference import max_gap
from .todos import Failure

if TYPE_CHECKING:
    from .observe import Observation

STOP_AFTER = 1  # the epochs the stopped run trains, of control.CHECK_EPOCHS
RESUME_KEYS = ("resume",)
BOTH_KEYS = ("resume", "checkpoint")


def resume_flags(checkpoint: Path) -> tuple[list[str], list[str]]:
    """The flags of the stopped run and of the resumed run, beside the check's own."""
    shared = ["--checkpoint", str(checkpoint)]
    return [*shared, "--stop-after", str(STOP_AFTER)], [*shared, "--resume"]


def _epochs(straight: Observation, stopped: Observation, resumed: Observation) -> Optional[Failure]:
    done, total = len(stopped.passes("train")), len(straight.passes("train"))
    trained = len(resumed.passes("train"))
    if trained == total - done:
        return None
    return Failure(
        "resume",
        f"rank {resumed.rank}'s resumed run trained {trained} epochs, where the checkpoint after epoch {done} "
        f"leaves {total - done} of {total}: go on at the epoch the checkpoint holds",
        RESUME_KEYS,
    )


def _start(straight: Observation, stopped: Observation, resumed: Observation) -> Optional[Failure]:
    if resumed.start is None or stopped.final is None:
        return None
    gap = max_gap(resumed.start, stopped.final)
    if gap <= 1e-6 * max(value.abs().max().item() for value in stopped.final.values()):
        return None
    return Failure(
        "resume",
        f"rank {resumed.rank}'s resumed run started from other weights than the stopped run ended with (up to "
        f"{gap:.3g} apart): save the weights of the model inside DDP and load them back",
        BOTH_KEYS,
    )


def _optimizer(straight: Observation, stopped: Observation, resumed: Observation) -> Optional[Failure]:
    before, after = resumed.optimizer_start, stopped.optimizer_final
    if before is None or after is None:
        return None
    if set(before) == set(after) and (not after or max_gap(before, after) == 0):
        return None
    held = f"held {', '.join(sorted({name.split('.', 1)[1] for name in after}))}" if after else "held nothing"
    what = "no optimizer state" if not before else "other optimizer state"
    return Failure(
        "resume",
        f"rank {resumed.rank}'s resumed run took its first step with {what}, where the stopped run's optimizer "
        f"{held} after its last (SGD's momentum moves the next steps): save optimizer.state_dict() and load it back",
        BOTH_KEYS,
    )


def _samples(straight: Observation, stopped: Observation, resumed: Observation) -> Optional[Failure]:
    done, uninterrupted = len(stopped.passes("train")), straight.passes("train")
    for number, samples in enumerate(resumed.passes("train"), done + 1):
        if number > len(uninterrupted) or samples == uninterrupted[number - 1]:
            continue
        same = next((index for index, other in enumerate(uninterrupted, 1) if other == samples), None)
        order = f"in the order of epoch {same}" if same else "in another order"
        return Failure(
            "resume",
            f"rank {resumed.rank}'s resumed run trained epoch {number} on its samples {order} of the uninterrupted "
            "run: the sampler deals an epoch's order from the seed and the epoch set_epoch is told, so the "
            "epochs must go on from the checkpoint's",
            RESUME_KEYS,
        )
    return None


def _random_state(straight: Observation, stopped: Observation, resumed: Observation) -> Optional[Failure]:
    epoch = len(stopped.passes("train")) + 1
    expected, drawn = straight.pass_random_states.get(epoch), resumed.pass_random_states.get(1)
    if expected is None or drawn is None or drawn == expected:
        return None
    return Failure(
        "resume",
        f"rank {resumed.rank}'s first training forward of epoch {epoch} drew from another random state than in the "
        "uninterrupted run, so with dropout on it would drop other units: save every rank's random state "
        "(torch.get_rng_state(), and the GPU's on a GPU) and restore this rank's",
        BOTH_KEYS,
    )


def _ranks(
    straight: list[Observation], stopped: list[Observation], resumed: list[Observation]
) -> Iterator[tuple[Observation, Observation, Observation]]:
    """Each rank's straight, stopped and resumed runs."""
    return zip(straight, stopped, resumed)


def check_resume(straight: list[Observation], stopped: list[Observation], resumed: list[Observation]) -> list[Failure]:
    """Property 12 on the records of the three runs, rank by rank: a line for each thing that differs
    (one rank's each), else one if the resumed run's weights are not the uninterrupted run's."""
    failures = []
    epochs = next(filter(None, (_epochs(*runs) for runs in _ranks(straight, stopped, resumed))), None)
    checks = (_start, _optimizer, _random_state) + (() if epochs else (_samples,))
    for check in checks:
        found = next(filter(None, (check(*runs) for runs in _ranks(straight, stopped, resumed))), None)
        if found is not None:
            failures.append(found)
    failures = ([epochs] if epochs else []) + failures
    if failures:
        return failures
    first_straight, first_stopped, first_resumed = straight[0], stopped[0], resumed[0]
    if first_resumed.final is None or first_straight.final is None or first_stopped.final is None:
        return []
    name, value = worst(update_differences(first_resumed.final, first_straight.final, first_stopped.final))
    if value <= UPDATE_BOUND:
        return []
    return [
        Failure(
            "resume",
            f"rank 0's resumed run ended {value:.3g} of the last epoch's update away from the uninterrupted run's "
            f"weights (in {name}; at most {UPDATE_BOUND:g}): the checkpoint must hold all the run needs to go on",
            BOTH_KEYS,
        )
    ]


def resumed_line(stopped: list[Observation], resumed: list[Observation]) -> str:
    """What the PASS line says of a resume that held."""
    done, left = len(stopped[0].passes("train")), len(resumed[0].passes("train"))
    return (
        f"; stopped after epoch {done} and resumed for {left} more, it ended with the weights of the run never "
        "stopped, from the same weights, optimizer state, samples and random state"
    )
