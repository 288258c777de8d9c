"""Judging a finished run: each property the ranks' records must show, and why a run did not finish.

What must hold (one Failure each, with the TODO keys that govern it):
1. every rank starts from rank 0's weights, and ends with the same weights;
2. those weights are what one process trains on the same global batches (the union of the ranks'
   batches at each step) at the same LRs, within harness.study.scaling.equivalence's UPDATE_BOUND of the
   update; if not, the usual causes are tried to name it: gradients summed instead of averaged, or
   clipped at norm 1.0 (DeepSpeed's default);
3. the LR is --lr scaled to the global batch by notebook 02's rule (lr.RULE: --lr x sqrt(ranks),
   warmed up) or by another rule its runs could not reject for the script's optimizer (lr.ACCEPTED);
   a warmup script climbs linearly per step from --lr at step 0 to that at step round(--warmup-epochs
   x steps per epoch), then stays there (step 5's text);
4. every epoch the ranks train on disjoint samples that leave out fewer than one global batch,
   in a new order each epoch; every evaluation scores each test image exactly once;
5. only rank 0 writes files, and it saves the model to --save;
6. only rank 0 reports, with the sums and counts of all ranks: through workshop.report every test
   image and every sample trained that epoch; printed by itself, the values of all ranks and not
   rank 0's own (metrics);
7. no rank picks its GPU by a global rank that is not its local rank (devices; seen when the ranks
   run as if on several nodes, `--simulate-nodes`);
8. an engine's config declares the batch each rank trains on and its global batch (batch:
   DeepSpeed's train_batch_size);
9. no two ranks draw their dropout masks from the same random state (seeds);
10. a step split into micro-batches averages the gradients over the ranks once, not after every
   micro-batch, by its framework's own mechanism (accumulation: DDP's no_sync, Horovod's
   backward_passes_per_step, DeepSpeed's gradient_accumulation_steps, FSDP2's
   set_requires_gradient_sync);
11. a step that takes --precision runs its training forwards under autocast in that dtype and keeps
   float32 weights (autocast; property 2 then allows 16-bit rounding: autocast.TOLERANCE);
12. a step that takes the resume flags, stopped after epoch 1 and resumed, ends with the weights of
   the run that was never stopped (resume: two more runs, which check_script starts).
13. a step that takes the model's size (--width, --hidden-layers) trains a large one at 4 ranks within
   a memory budget per rank that only a model sharded layer by layer fits (memory: one more run).
Weights are compared with the observed LRs and batches, so each mistake fails one property only.
A run that did not finish gets one line instead (`run_failure`): the TODO it reached, the error that
stopped it (a rank that failed because a peer did points at the peer; DeepSpeed refusing the batch
settings is property 8's line, Horovod refusing a second backward pass in a step property 10's), or
where each rank hung.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from ...study.scaling.equivalence import UPDATE_BOUND, update_differences, worst
from .accumulation import MECHANISMS, accumulates, averaged_once, check_accumulation, stopped_accumulating
from .autocast import check_precision, update_bound
from .batch import BATCH_COMPLAINT, check_global_batch
from .control import RunDirectory
from .devices import check_devices
from .files import check_files
from .lr import check_lr
from .metrics import check_metrics
from .observe import Observation
from .reference import check_one_process, max_gap
from .seeds import check_rank_seeds
from .shards import check_evaluation, check_training_data
from .todos import Failure, Framework


def _where(line: Optional[int], source: str, script: str) -> str:
    return f" at line {line} of {os.path.basename(script)} ({source.strip()})" if line else ""


def run_failure(
    observations: dict[int, Optional[Observation]],
    ranks: int,
    status: Optional[int],
    timed_out: bool,
    timeout: float,
    run: RunDirectory,
    script: str,
    framework: Framework,
) -> Optional[Failure]:
    """The line that says why the run did not finish, or None if every rank finished its script."""
    errors = [
        (rank, observation.error)
        for rank, observation in observations.items()
        if observation is not None and observation.error is not None
    ]
    todos = [error for _, error in errors if error["todo"]]
    if todos:
        return Failure("run", todos[0]["message"], ())
    output = f"(output: {run.output_log})"
    if errors:
        return _stopped(errors, observations, ranks, run, script, framework, output)
    if timed_out:
        places = ", ".join(f"rank {rank} at {run.stuck_at(rank, script)}" for rank in range(ranks))
        return Failure("run", f"the run did not finish within {timeout:g} s: {places} {output}", ())
    missing = [rank for rank in range(ranks) if observations.get(rank) is None]
    if missing:
        return Failure(
            "run",
            f"rank {', '.join(map(str, missing))} never finished the script (launcher exit status "
            f"{status}; killed, or the launcher failed to start it) {output}",
            (),
        )
    return None


def _stopped(
    errors: list[tuple[int, dict[str, Any]]],
    observations: dict[int, Optional[Observation]],
    ranks: int,
    run: RunDirectory,
    script: str,
    framework: Framework,
    output: str,
) -> Failure:
    """The line of a run that a rank's error stopped: the first error not caused by a peer."""
    causes = [entry for entry in errors if not entry[1]["peer"]] or errors
    rank, error = min(causes, key=lambda entry: entry[1]["time"])
    message = re.sub(r"^\[[^\]]*\]\s*", "", error["message"])  # a library's leading [source:line] tag
    refused = stopped_accumulating(rank, message, framework)
    if refused is not None:
        return refused
    batch_complaint = bool(framework.config_keys) and BATCH_COMPLAINT.search(message) is not None
    if batch_complaint:  # DeepSpeed refused the batch settings: say what they should be, if they were seen
        seen = check_global_batch(
            [observation for observation in observations.values() if observation is not None], ranks, framework
        )
        if seen:
            return seen[0]
    waiting = ""
    if error["peer"]:
        places = {other: _place(other, observations, run, script) for other in range(ranks)}
        others = ", ".join(f"rank {other} was at {place}" for other, place in places.items() if other != rank)
        diverged = len({place for place in places.values() if place.startswith("line")}) > 1
        waiting = (
            f"; it waited in vain for another rank ({others}): every rank must make the same collective calls"
            + (", in the same order (a collective inside `if rank == ...` hangs the others)" if diverged else "")
        )
    return Failure(
        "run",
        f"rank {rank} stopped with {error['type']}: {message}"
        f"{_where(error['line'], error['source'], script)}{waiting} {output}",
        framework.config_keys if batch_complaint else (),
    )


def _place(rank: int, observations: dict[int, Optional[Observation]], run: RunDirectory, script: str) -> str:
    """Where `rank` was when the run stopped: the script line of its own error, else its stack dump's."""
    observation = observations.get(rank)
    error = observation.error if observation is not None else None
    if error and error["line"]:
        return f"line {error['line']} ({error['source'].strip()})"
    return run.stuck_at(rank, script)


# --- the properties ---------------------------------------------------------------------------


def _check_weights(observations: list[Observation], framework: Framework) -> tuple[list[Failure], bool]:
    """Property 1; also whether the ranks agree (then property 2 can be judged on rank 0's weights)."""
    first = observations[0]
    for observation in observations[1:]:
        if max_gap(observation.start, first.start) > 1e-6 * max(v.abs().max().item() for v in first.start.values()):
            gap = max_gap(observation.start, first.start)
            return [
                Failure(
                    "same start",
                    f"the ranks started training from different weights (rank "
                    f"{observation.rank}'s differ from rank 0's by up to {gap:.3g}): every rank "
                    "must start from rank 0's weights",
                    framework.start_keys,
                )
            ], False
    for observation in observations[1:]:
        name, value = worst(update_differences(observation.final, first.final, first.start))
        if value > UPDATE_BOUND:
            return [
                Failure(
                    "same end",
                    f"the ranks started alike but ended with different weights (rank "
                    f"{observation.rank}'s differ from rank 0's by {value:.3g} of the update, in "
                    f"{name}): the gradients are not averaged over the ranks",
                    # A step of micro-batches averages in its last backward only: the framework's
                    # accumulation mechanism kept that one local too.
                    tuple(
                        dict.fromkeys(
                            (framework.accumulation_keys if accumulates(observations) else ()) + framework.sync_keys
                        )
                    ),
                )
            ], False
    return [], True


def judge(observations: list[Observation], framework: Framework, ranks: int, run: RunDirectory) -> list[Failure]:
    """Every property that does not hold for the records of a run in which every rank finished."""
    first = observations[0]
    failures: list[Failure] = []
    if not all(observation.models_built for observation in observations):
        failures.append(
            Failure(
                "weights",
                "the checker saw no model built with workshop.build_model on every rank, so it cannot compare weights",
                framework.start_keys,
            )
        )
    elif not all(observation.steps and observation.start is not None for observation in observations):
        failures.append(Failure("weights", "a rank took no optimizer step with training data", ("shard",)))
    else:
        weight_failures, ranks_agree = _check_weights(observations, framework)
        failures += weight_failures
        if ranks_agree and len({len(observation.steps) for observation in observations}) == 1:
            failures += check_one_process(observations, framework, ranks, update_bound(observations))
        failures += check_lr(observations, ranks)
    failures += check_training_data(observations, ranks)
    failures += check_evaluation(observations)
    failures += check_files(run, ranks, (first.args or {}).get("save", "model.pt"), first.final)
    failures += check_metrics(observations)
    failures += check_devices(observations, framework)
    failures += check_global_batch(observations, ranks, framework)
    failures += check_rank_seeds(observations, framework)
    failures += check_accumulation(observations, framework)
    failures += check_precision(observations)
    return failures


def pass_line(observations: list[Observation], ranks: int, framework: Framework) -> str:
    """The one line of a script that passed."""
    first = observations[0]
    batch = len(first.step_batches()[0]) * ranks
    nodes = (
        ", and no rank picked its GPU by its global rank where that is not its local rank"
        if any(observation.local_rank != observation.rank for observation in observations)
        else ""
    )
    micro_batches = max((passes for _, passes in first.gradient_syncs), default=1)
    accumulated = (
        f"; the {micro_batches} micro-batches of a step averaged their gradients over the ranks once "
        f"({MECHANISMS[framework.backend].name})"
        if averaged_once(observations)
        else ""
    )
    precision = (
        f", within {update_bound(observations):g} of the update in float32 (the forwards ran under autocast in "
        f"{' and '.join(filter(None, first.autocast_dtypes))}, the weights in float32)"
        if update_bound(observations) != UPDATE_BOUND
        else ""
    )
    return (
        f"PASS: {ranks} ranks x {len(first.steps)} steps ended with the same weights, those of one process on "
        f"the same {batch}-sample global batches at the LR the exercise asks{precision}{accumulated}; each rank drew its "
        "dropout from random numbers of its own; each epoch every training sample went to one rank at most, "
        "in a new order; each evaluation scored every test image once; only rank 0 wrote files and reported, "
        f"the sums of all ranks{nodes}"
    )
