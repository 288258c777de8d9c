"""Judging a finished run: each property the ranks' records must show, and why a run did not finish.

What must hold (one Failure each, with the TODO keys that govern it):
1. every rank starts from rank 0's weights, and ends with the same weights;
2. those weights are what one process trains on the same global batches (the union of the ranks'
   batches at each step) at the same LRs, within harness.study.equivalence's UPDATE_BOUND of the
   update; if not, the usual causes are tried to name it: gradients summed instead of averaged, or
   clipped at norm 1.0 (DeepSpeed's default);
3. the LR is --lr scaled to the global batch by a rule the exercise accepts for its optimizer: the
   linear rule (--lr x ranks) for SGD; for Adam and the other adaptive optimizers the square-root
   rule (--lr x sqrt(ranks)) or the linear one, which notebook 02's runs do not tell apart; a warmup script climbs linearly per step from --lr at
   step 0 to that at step round(--warmup-epochs x steps per epoch), then stays there (step 5's text);
4. every epoch the ranks train on disjoint samples that leave out fewer than one global batch,
   in a new order each epoch; every evaluation scores each test image exactly once;
5. only rank 0 writes files, and it saves the model to --save;
6. only rank 0 reports, with the sums and counts of all ranks: through workshop.report every test
   image and every sample trained that epoch; printed by itself, the values of all ranks and not
   rank 0's own (metrics);
7. no rank picks its GPU by a global rank that is not its local rank (devices; seen when the ranks
   run as if on several nodes, `--simulate-nodes`);
8. an engine's config declares the batch each rank trains on and its global batch (batch:
   DeepSpeed's train_batch_size).
Weights are compared with the observed LRs and batches, so each mistake fails one property only.
A run that did not finish gets one line instead (`run_failure`): the TODO it reached, the error that
stopped it (a rank that failed because a peer did points at the peer; DeepSpeed refusing the batch
settings is property 8's line), or where each rank hung.
"""

from __future__ import annotations

import collections
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from ...study.equivalence import UPDATE_BOUND, update_differences, worst
from ...training.lr import learning_rate, scaled_lr
from ...training.models import WorkshopCNN
from .. import exercise
from .batch import BATCH_COMPLAINT, check_global_batch
from .control import CHECK_BATCH, RunDirectory
from .devices import check_devices
from .metrics import check_metrics
from .observe import Observation
from .todos import Failure, Framework

CLIP_NORM = 1.0  # DeepSpeed's default gradient_clipping
# The optimizers for which the exercises accept the square-root LR rule beside the linear one (lr_rules).
SQUARE_ROOT_OPTIMIZERS = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad", "Adadelta", "RMSprop"})


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


def _max_gap(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    return max((weights[name].double() - value.double()).abs().max().item() for name, value in reference.items())


def _check_weights(observations: list[Observation], framework: Framework) -> tuple[list[Failure], bool]:
    """Property 1; also whether the ranks agree (then property 2 can be judged on rank 0's weights)."""
    first = observations[0]
    for observation in observations[1:]:
        if _max_gap(observation.start, first.start) > 1e-6 * max(v.abs().max().item() for v in first.start.values()):
            gap = _max_gap(observation.start, first.start)
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
                    framework.sync_keys,
                )
            ], False
    return [], True


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


def _check_one_process(observations: list[Observation], framework: Framework, ranks: int) -> list[Failure]:
    """Property 2, on rank 0's weights (the ranks agree)."""
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
    if value <= UPDATE_BOUND:
        return []
    batch = sum(len(indices) for indices in batches[0])
    observed = (
        f"rank 0's weights differ from one process trained on the same {batch}-sample global batches at "
        f"the same LRs by {value:.3g} of the update (in {name}; at most {UPDATE_BOUND:g})"
    )

    def scaled(model: torch.nn.Module) -> None:
        for parameter in model.parameters():
            parameter.grad.mul_(ranks)

    def clipped(model: torch.nn.Module) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)

    if distance(gradients=scaled)[1] <= UPDATE_BOUND:
        return [
            Failure(
                "one process",
                f"{observed}; they match one process whose gradients are {ranks}x larger: "
                "the gradients are summed over the ranks, not averaged",
                framework.sync_keys,
            )
        ]
    if distance(gradients=clipped)[1] <= UPDATE_BOUND:
        return [
            Failure(
                "one process",
                f"{observed}; they match one process that clips the gradient norm at "
                f"{CLIP_NORM:g} (DeepSpeed's default gradient_clipping): turn clipping off",
                framework.clip_keys,
            )
        ]
    return [
        Failure(
            "one process",
            observed,
            framework.sync_keys + framework.clip_keys
            if framework.clip_keys != framework.sync_keys
            else framework.sync_keys,
        )
    ]


def lr_rules(optimizer: Optional[dict[str, Any]]) -> tuple[str, ...]:
    """The LR scaling rules (harness.training.lr's names) the exercise accepts for this optimizer:
    the linear rule for SGD (Goyal et al.); for the adaptive ones the square-root rule or the linear
    one, both with warmup where the script warms up: notebook 02's Adam runs do not tell them apart."""
    return ("sqrt", "linear") if optimizer and optimizer["class"] in SQUARE_ROOT_OPTIMIZERS else ("linear",)


def _rule_text(optimizer: Optional[dict[str, Any]], ranks: int, base: float) -> str:
    name = optimizer["class"] if optimizer else "its optimizer"
    if len(lr_rules(optimizer)) > 1:
        return (
            f"for {name} the exercise scales it by the square-root rule, --lr x sqrt({ranks}) = "
            f"{scaled_lr(base, ranks, 1, 'sqrt'):.4g}, or the linear one, --lr x {ranks} = "
            f"{scaled_lr(base, ranks, 1, 'linear'):.4g}"
        )
    return f"for {name} the exercise scales it by the linear rule: --lr x {ranks} = {base * ranks:.4g}"


def _check_lr(observations: list[Observation], ranks: int) -> list[Failure]:
    """Property 3, step by step against harness.training.lr's rules (warmup from --lr at step 0):
    the failures of the first accepted rule if no accepted rule matches."""
    first = observations[0]
    if not first.args or "lr" not in first.args:
        return [
            Failure(
                "learning rate",
                "the script did not read its flags with workshop.parse_args, so the checker cannot tell its --lr",
                ("lr",),
            )
        ]
    verdicts = [_lr_failures(observations, ranks, rule) for rule in lr_rules(first.optimizer)]
    return [] if not all(verdicts) else verdicts[0]


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
                        f"(--lr {base:g}); {_rule_text(first.optimizer, ranks, base)}",
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


def _check_training_data(observations: list[Observation], ranks: int) -> list[Failure]:
    """Property 4, training: disjoint shards covering all but the tail, same steps, a new order every epoch."""
    failures = []
    first = observations[0]
    steps = {observation.rank: len(observation.steps) for observation in observations}
    if len(set(steps.values())) > 1:
        counts = ", ".join(f"rank {rank} {count}" for rank, count in steps.items())
        failures.append(
            Failure(
                "shards",
                f"the ranks took different numbers of optimizer steps ({counts}): "
                "every rank must take the same number",
                ("shard",),
            )
        )
    epochs = [observation.passes("train") for observation in observations]
    if not epochs[0]:
        return failures + [
            Failure("shards", "no rank fetched a training sample from exercise.digits('train', ...)", ("shard",))
        ]
    if len({len(passes) for passes in epochs}) > 1:
        counts = ", ".join(f"rank {rank} {len(passes)}" for rank, passes in enumerate(epochs))
        return failures + [
            Failure(
                "shards", f"the ranks made different numbers of passes over the training data ({counts})", ("shard",)
            )
        ]
    samples = first.args.get("train_samples") if first.args else None
    samples = samples or len(exercise.digits("train"))
    global_batch = ranks * (first.args.get("batch_size", CHECK_BATCH) if first.args else CHECK_BATCH)
    for epoch, shards in enumerate(zip(*epochs), 1):
        counts = collections.Counter(index for shard in shards for index in shard)
        repeated = [index for index, count in counts.items() if count > 1]
        if repeated:
            owners = [rank for rank, shard in enumerate(shards) if repeated[0] in shard]
            same = all(shard == shards[0] for shard in shards)
            how = (
                "every rank trained on the same samples"
                if same
                else f"{len(repeated)} training samples were trained on more than once (sample {repeated[0]} by "
                f"rank{'s' if len(owners) > 1 else ''} {', '.join(map(str, owners))})"
            )
            failures.append(
                Failure(
                    "shards",
                    f"in epoch {epoch} {how}: each rank must train on its own part of the epoch's samples",
                    ("shard",),
                )
            )
            break
        unseen = samples - len(counts)
        if unseen >= global_batch:
            failures.append(
                Failure(
                    "shards",
                    f"in epoch {epoch} {unseen} of the {samples} training samples were "
                    f"trained on by no rank; only the fewer than {global_batch} after the "
                    "last full global batch may be left out",
                    ("shard",),
                )
            )
            break
    if len(epochs[0]) > 1 and not failures:
        repeating = [rank for rank, passes in enumerate(epochs) if passes[1] == passes[0]]
        if repeating:
            who = "every rank" if len(repeating) == ranks else f"rank {', '.join(map(str, repeating))}"
            failures.append(
                Failure(
                    "reshuffle",
                    f"{who} trained epoch 2 in exactly the order of epoch 1: the data must be reshuffled every epoch",
                    ("reshuffle",),
                )
            )
    return failures


def _check_evaluation(observations: list[Observation]) -> list[Failure]:
    """Property 4, evaluation: every test image scored exactly once per evaluation."""
    evaluations = [observation.passes("test") for observation in observations]
    size = len(exercise.digits("test"))
    if not any(evaluations):
        return [Failure("evaluation", "no rank scored a test image from exercise.digits('test')", ("eval-shard",))]
    for number in range(max(len(passes) for passes in evaluations)):
        counts = collections.Counter(
            index for passes in evaluations if number < len(passes) for index in passes[number]
        )
        scored = sum(counts.values())
        repeated = [index for index, count in counts.items() if count > 1]
        missing = size - len(counts)
        if not repeated and not missing:
            continue
        if repeated and all(count == counts[repeated[0]] for count in counts.values()) and not missing:
            how = f"scored each of the {size} test images {counts[repeated[0]]} times"
        elif repeated:
            how = (
                f"scored {scored} images for {size}: {len(repeated)} of them more than once (image {repeated[0]} "
                f"{counts[repeated[0]]} times; DistributedSampler pads with repeated images)"
            )
        else:
            how = f"scored {len(counts)} of the {size} test images; {missing} were scored by no rank"
        return [
            Failure(
                "evaluation",
                f"evaluation {number + 1} {how}: every test image must be scored exactly once",
                ("eval-shard",),
            )
        ]
    return []


def _check_saved_model(path: Path, final: Optional[dict[str, torch.Tensor]]) -> Optional[str]:
    """What is wrong with the model file rank 0 saved, or None: it must load into the plain model
    (`workshop.build_model()`: its keys, whole tensors of its shapes) with the weights the ranks ended
    with. A wrapper's state dict (DDP's `module.` prefix), an FSDP shard or a DTensor would load into
    nothing an attendee evaluates later."""
    mesh_log = logging.getLogger("torch.distributed.device_mesh")  # warns when a DTensor's mesh unpickles
    level, mesh_log.level = mesh_log.level, logging.ERROR
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any failure to load is the finding
        return f"its --save file {path.name} does not load outside the run ({type(error).__name__}: {error})"
    finally:
        mesh_log.setLevel(level)
    expected = WorkshopCNN(dropout=0.0).state_dict()
    if not isinstance(saved, dict) or not all(isinstance(value, torch.Tensor) for value in saved.values()):
        return f"its --save file {path.name} holds a {type(saved).__name__}, not a state dict of tensors"
    if set(saved) != set(expected):
        prefixed = sorted(name for name in saved if name not in expected)
        return (
            f"its --save file {path.name} has keys the plain model lacks ({', '.join(prefixed[:2])}"
            f"{' ...' if len(prefixed) > 2 else ''}): save the state dict of the model inside the wrapper"
        )
    for name, value in expected.items():
        tensor = saved[name]
        if type(tensor) is not torch.Tensor:  # a DTensor: this rank's pieces of a sharded weight
            return (
                f"its --save file {path.name} holds {name} as a {type(tensor).__name__}, the ranks' "
                "pieces of a sharded weight, not a whole tensor: gather the pieces of every rank before saving"
            )
        if tuple(tensor.shape) != tuple(value.shape):
            return (
                f"its --save file {path.name} holds {name} with shape {list(tensor.shape)}, not the whole "
                f"{list(value.shape)} tensor: gather the pieces of every rank before saving"
            )
    if final is not None and _max_gap(saved, final) > 1e-6 * max(v.abs().max().item() for v in final.values()):
        return f"its --save file {path.name} does not hold the weights the ranks ended with"
    return None


def _check_files(
    run: RunDirectory, ranks: int, save: str, final: Optional[dict[str, torch.Tensor]] = None
) -> list[Failure]:
    """Property 5."""
    failures = []
    for rank in range(1, ranks):
        written = sorted(
            str(path.relative_to(run.files(rank))) for path in run.files(rank).rglob("*") if path.is_file()
        )
        if written:
            failures.append(
                Failure(
                    "rank 0 writes",
                    f"rank {rank} wrote {', '.join(written[:3])}"
                    f"{' ...' if len(written) > 3 else ''}: only rank 0 writes files",
                    ("save",),
                )
            )
            break
    saved = run.files(0) / save
    if not saved.is_file():
        failures.append(Failure("rank 0 writes", f"rank 0 did not save the model to --save {save}", ("save",)))
    elif not failures:  # one line per property: a second writer is named first
        wrong = _check_saved_model(saved, final)
        if wrong:
            failures.append(Failure("rank 0 writes", f"rank 0 saved the model, but {wrong}", ("save",)))
    return failures


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
            failures += _check_one_process(observations, framework, ranks)
        failures += _check_lr(observations, ranks)
    failures += _check_training_data(observations, ranks)
    failures += _check_evaluation(observations)
    failures += _check_files(run, ranks, (first.args or {}).get("save", "model.pt"), first.final)
    failures += check_metrics(observations)
    failures += check_devices(observations, framework)
    failures += check_global_batch(observations, ranks, framework)
    return failures


def pass_line(observations: list[Observation], ranks: int) -> str:
    """The one line of a script that passed."""
    first = observations[0]
    batch = len(first.step_batches()[0]) * ranks
    nodes = (
        ", and no rank picked its GPU by its global rank where that is not its local rank"
        if any(observation.local_rank != observation.rank for observation in observations)
        else ""
    )
    return (
        f"PASS: {ranks} ranks x {len(first.steps)} steps ended with the same weights, those of one process on "
        f"the same {batch}-sample global batches at the LR the exercise asks; each epoch every training sample "
        "went to one rank at most, in a new order; each evaluation scored every test image once; only rank 0 "
        f"wrote files and reported, the sums of all ranks{nodes}"
    )
