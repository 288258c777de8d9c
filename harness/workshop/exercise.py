"""What the hands-on scripts share, so that neighbouring steps differ only in their distributed code.

The steps in solutions/ (01_serial.py ... 09_mixed_precision.py) use torch, Horovod and DeepSpeed directly:
that is what attendees learn. From here they take only what is not about data parallelism:

- `parse_args`: the flags every step accepts (epochs, per-process batch, LR, seed, dropout, ...);
- `digits`: the embedded digits (harness.data.builtin) as a torch Dataset;
- `build_model`: the workshop CNN (harness.tasks.models.WorkshopCNN);
- `evaluate` and `report`: a model's summed test loss and correct count, and the epoch's line;
- `use_launcher_environment`: torchrun's variables under any launcher (harness.process.discovery), so that
  `init_process_group`'s default env:// works under srun, mpiexec and horovodrun as well;
- `skip_deepspeed_shm_op`: DeepSpeed on a CPU without the op it would compile for inference;
- `todo`: what an exercise runs where a step is left to the attendee.

The TODO convention. A solution marks each piece of distributed code that the exercise leaves out:

    # TODO(shard): each rank trains on its own part of every epoch      <- key and title
    # DistributedSampler(...) deals each rank every world_size-th ...   <- comments: kept as the hint
    sampler = DistributedSampler(train_set, ...)                         <- code: left to the attendee
    # END TODO

tools/make_exercises.py numbers the blocks in order and writes the exercise with each block's
code replaced by `workshop.todo(N, "title")`, which stops the run with "TODO N of FILE is not done yet:
title". `harness check` (harness.workshop.checker) names the TODO that governs a failed property by
its key, and watches a run through an ExerciseObserver per rank (`add_observer`): what each rank
fetched, the model it built, its flags, what it evaluated and reported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn, Optional, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..data.builtin import load_digits
from ..process.discovery import ClusterEnv, detect_cluster
from ..tasks.models import WorkshopCNN


class ExerciseObserver(Protocol):
    """What a hands-on script does through this module, told as it happens. `harness check`
    registers one in each rank it runs (add_observer); a normal run has none."""

    def arguments_parsed(self, args: argparse.Namespace) -> None:
        """parse_args read the script's flags."""

    def batch_fetched(self, split: str, indices: Sequence[int]) -> None:
        """A Digits split served the samples `indices` (a DataLoader's batch, or one sample)."""

    def model_built(self, model: nn.Module) -> None:
        """build_model made `model`, before the script moves or wraps it."""

    def evaluated(self, sums: torch.Tensor) -> None:
        """evaluate is about to return these sums of one rank's test images."""

    def reported(self, epoch: int, train_sums: torch.Tensor, test_sums: torch.Tensor) -> None:
        """report is about to print epoch `epoch`'s line from these sums."""


# Registered through add_observer only; a normal run leaves it empty and pays an empty loop per event.
_observers: list[ExerciseObserver] = []


def add_observer(observer: ExerciseObserver) -> None:
    """Tell `observer` from now on what this process's hands-on script does through this module."""
    _observers.append(observer)


TODO_START = re.compile(r"^(?P<indent>\s*)# TODO\((?P<key>[a-z0-9-]+)\): (?P<title>.+)$")
TODO_END = re.compile(r"^\s*# END TODO\s*$")
# A solution that builds on an earlier step may exercise only some of its blocks; the others stay
# in its exercise as given code: "# exercise: only TODO(warmup)" (or "TODO(a), TODO(b)").
EXERCISE_ONLY = re.compile(r"^# exercise: only (?P<keys>TODO\([a-z0-9-]+\)(?:, TODO\([a-z0-9-]+\))*)\s*$")


class TodoNotDone(SystemExit):
    """An exercise reached a step the attendee has not written yet. A SystemExit: Python prints its
    one-line message without a traceback and exits with status 1."""


def todo(number: int, title: str) -> NoReturn:
    """Stop here: "TODO `number` of FILE is not done yet: `title`" (what an unfinished exercise step runs)."""
    caller = sys._getframe(1).f_code.co_filename
    where = os.path.basename(caller) if caller.endswith(".py") else "this notebook"
    raise TodoNotDone(f"TODO {number} of {where} is not done yet: {title}")


@dataclass(frozen=True)
class TodoBlock:
    """One marked block of a solution: lines first..last (0-based, markers included). `number` is
    its TODO number in the exercise, None for a block the exercise keeps as given code."""

    key: str
    title: str
    first: int
    last: int
    number: Optional[int]


def todo_blocks(text: str, name: str = "solution") -> list[TodoBlock]:
    """The TODO blocks of a solution's text in order, the exercised ones numbered from 1. Raises
    ValueError for an unclosed, nested or stray marker, a key used twice, or an `exercise: only`
    line naming a key that has no block."""
    lines = text.splitlines()
    only = [re.findall(r"TODO\(([a-z0-9-]+)\)", match["keys"]) for match in map(EXERCISE_ONLY.match, lines) if match]
    exercised = set(only[0]) if only else None
    found: list[tuple[str, str, int, int]] = []
    start: Optional[tuple[int, re.Match]] = None
    for index, line in enumerate(lines):
        opening, closing = TODO_START.match(line), TODO_END.match(line)
        if opening and start is not None:
            raise ValueError(f"{name}:{index + 1}: TODO block opened inside the one of line {start[0] + 1}")
        if closing and start is None:
            raise ValueError(f"{name}:{index + 1}: END TODO without a TODO(key) line above it")
        if opening:
            start = (index, opening)
        elif closing:
            first, match = start  # type: ignore[misc]
            if match["key"] in {key for key, *_ in found}:
                raise ValueError(f"{name}:{first + 1}: TODO key {match['key']!r} is used twice")
            found.append((match["key"], match["title"].strip(), first, index))
            start = None
    if start is not None:
        raise ValueError(f"{name}:{start[0] + 1}: TODO block has no END TODO")
    unknown = (exercised or set()) - {key for key, *_ in found}
    if unknown:
        raise ValueError(f"{name}: 'exercise: only' names TODO({', '.join(sorted(unknown))}), which has no block")
    blocks, number = [], 0
    for key, title, first, last in found:
        if exercised is None or key in exercised:
            number += 1
            blocks.append(TodoBlock(key, title, first, last, number))
        else:
            blocks.append(TodoBlock(key, title, first, last, None))
    return blocks


def exercise_text(solution: str, name: str = "solution") -> str:
    """The exercise of a solution. An exercised TODO block becomes its numbered heading, its leading
    comment lines (the hint) and `workshop.todo(N, "title")` in place of its code; a given block keeps its
    code, its title as a plain comment. The `exercise: only` line is left out."""
    lines = solution.splitlines()
    output: list[str] = []
    position = 0
    for block in todo_blocks(solution, name):
        output.extend(lines[position : block.first])
        indent = TODO_START.match(lines[block.first])["indent"]  # type: ignore[index]
        body = lines[block.first + 1 : block.last]
        if block.number is None:
            output.append(f"{indent}# {block.title[0].upper()}{block.title[1:]}")
            output.extend(body)
        else:
            hint_lines = 0
            while hint_lines < len(body) and body[hint_lines].strip().startswith("#"):
                hint_lines += 1
            output.append(f"{indent}# TODO {block.number}: {block.title}")
            output.extend(body[:hint_lines])
            output.append(f"{indent}workshop.todo({block.number}, {json.dumps(block.title, ensure_ascii=False)})")
        position = block.last + 1
    output.extend(lines[position:])
    return "\n".join(line for line in output if not EXERCISE_ONLY.match(line)) + "\n"


def _in_notebook() -> bool:
    # A Jupyter kernel's argv holds its own flags (-f kernel.json), not the script's.
    return "ipykernel" in sys.modules


def parse_args(
    description: str,
    warmup: bool = False,
    argv: Optional[Sequence[str]] = None,
    accumulation: bool = False,
    resume: bool = False,
    precision: bool = False,
    memory: bool = False,
) -> argparse.Namespace:
    """The flags of a hands-on step (in a notebook the defaults, unless `argv` is given). `warmup` adds
    --warmup-epochs, `accumulation` --micro-batches, `resume` the resume flags, `precision` --precision,
    `memory` the model's --width and --hidden-layers.

    `--batch-size` is per process and `--lr` is the learning rate for one process's batch: what
    the global batch makes of it is the script's business (that is the lesson).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=3, help="passes over the training set (default: 3)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per process and step (default: 32)")
    parser.add_argument(
        "--lr", type=float, default=0.03, help="learning rate for one process's batch of --batch-size (default: 0.03)"
    )
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the weights and the data order (default: 0)")
    parser.add_argument(
        "--dropout",
        type=float,
        default=None,
        help="both dropout rates of the CNN; 0 turns dropout off (default: 0.25 and 0.5)",
    )
    parser.add_argument(
        "--train-samples",
        type=int,
        default=None,
        help="train on the first N of the 1,500 training images only (default: all)",
    )
    parser.add_argument("--save", default="model.pt", help="file the trained weights are saved to (default: model.pt)")
    # The deepspeed launcher passes --local_rank=N to every rank unless told --no_local_rank; the
    # steps read the local rank from the environment (LOCAL_RANK), as under every other launcher.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    if warmup:
        parser.add_argument(
            "--warmup-epochs",
            type=float,
            default=1.0,
            help="epochs over which the LR ramps up from --lr to the scaled LR (default: 1)",
        )
    _add_step_flags(parser, accumulation, memory, resume, precision)
    if argv is None and _in_notebook():
        argv = []
    args = parser.parse_args(argv)
    _check_values(parser, args)
    for observer in _observers:
        observer.arguments_parsed(args)
    return args


def _add_step_flags(
    parser: argparse.ArgumentParser, accumulation: bool, memory: bool, resume: bool, precision: bool
) -> None:
    """The flags of steps 3, 4, 6 and 7 (`accumulation`), 6 (`memory`), 8 (`resume`) and 9 (`precision`)."""
    if accumulation:
        parser.add_argument(
            "--micro-batches",
            type=int,
            default=2,
            help="micro-batches each process splits its --batch-size into, one forward and backward each (default: 2)",
        )
    if memory:
        parser.add_argument("--width", type=int, default=128, help="units of the CNN's hidden layers (default: 128)")
        parser.add_argument(
            "--hidden-layers",
            type=int,
            default=0,
            help="width x width layers added after the first hidden layer, for a model whose memory matters "
            "(default: 0)",
        )
    if precision:
        parser.add_argument(
            "--precision",
            choices=("fp32", "bf16", "fp16"),
            default="bf16",
            help="forward and loss under torch.autocast in bf16 or fp16 (fp16 with a loss scaler); "
            "the weights stay float32 (default: bf16)",
        )
    if not resume:
        return
    parser.add_argument(
        "--checkpoint",
        default="checkpoint.pt",
        help="file the training state is saved to after every epoch, and resumed from (default: checkpoint.pt)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint instead of starting afresh")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="stop after this epoch, its checkpoint written, as a job whose time ran out (default: run all epochs)",
    )


def _check_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with the parser's one-line error at a value no step can run with."""
    training_images = len(load_digits("train"))
    for flag, value, low in (
        ("--epochs", args.epochs, 1),
        ("--batch-size", args.batch_size, 1),
        ("--train-samples", args.train_samples, 1),
        ("--stop-after", getattr(args, "stop_after", None), 1),
        ("--width", getattr(args, "width", None), 1),
        ("--hidden-layers", getattr(args, "hidden_layers", None), 0),
    ):
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    micro_batches = getattr(args, "micro_batches", 1)
    if not 1 <= micro_batches <= args.batch_size:
        parser.error(f"--micro-batches must be between 1 and --batch-size {args.batch_size}, got {micro_batches}")
    if args.train_samples is not None and args.train_samples > training_images:
        parser.error(f"--train-samples must be at most {training_images}, got {args.train_samples}")
    if not args.lr > 0:
        parser.error(f"--lr must be positive, got {args.lr}")


class Digits(Dataset):
    """A split of the embedded digits: normalised float images [1, 28, 28] and int64 labels.

    A DataLoader fetches a batch through __getitems__ in one call; both fetch paths tell the
    observers (add_observer) which samples went out.
    """

    def __init__(self, split: str, samples: Optional[int] = None) -> None:
        arrays = load_digits(split)
        count = len(arrays) if samples is None else samples
        images, labels = arrays.fetch(np.arange(count))
        self.images = arrays.normaliser(torch.device("cpu"))(images)
        self.labels = labels
        self.split = split

    def __len__(self) -> int:
        return len(self.labels)

    def _observe(self, indices: Sequence[int]) -> None:
        for observer in _observers:
            observer.batch_fetched(self.split, indices)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self._observe([int(index)])
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        indices = [int(index) for index in indices]
        self._observe(indices)
        return [(self.images[index], self.labels[index]) for index in indices]


def digits(split: str, samples: Optional[int] = None) -> Digits:
    """The "train" (1,500 images) or "test" (297) split of the embedded digits; `samples` keeps the first N."""
    return Digits(split, samples)


def build_model(dropout: Optional[float] = None, width: int = 128, hidden_layers: int = 0) -> nn.Module:
    """A freshly initialised workshop CNN (from torch's global RNG: seed it first); `width` and
    `hidden_layers` make it larger (WorkshopCNN)."""
    model = WorkshopCNN(dropout=dropout, width=width, hidden_layers=hidden_layers)
    for observer in _observers:
        observer.model_built(model)
    return model


def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> torch.Tensor:
    """[summed loss, correct predictions, samples] over `loader`: sums and counts, which add up
    over batches and over ranks (averages of averages would not)."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, device=device)
    with torch.no_grad():
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            sums += torch.stack(
                [
                    F.cross_entropy(logits, labels, reduction="sum"),
                    (logits.argmax(1) == labels).sum().float(),
                    torch.tensor(float(len(labels)), device=device),
                ]
            )
    model.train(was_training)
    for observer in _observers:
        observer.evaluated(sums)
    return sums


def report(epoch: int, train_sums: torch.Tensor, test_sums: torch.Tensor) -> None:
    """Print an epoch's line from [summed loss, samples] of training and evaluate()'s test sums."""
    for observer in _observers:
        observer.reported(epoch, train_sums, test_sums)
    train_loss, train_samples = train_sums.tolist()
    test_loss, correct, test_samples = test_sums.tolist()
    print(
        f"epoch {epoch + 1}: train loss {train_loss / train_samples:.4f} | test loss {test_loss / test_samples:.4f}, "
        f"accuracy {correct / test_samples:.1%} ({test_samples:.0f} images)",
        flush=True,
    )


def use_launcher_environment() -> ClusterEnv:
    """Export torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT) from whichever launcher started this process, as harness.process.discovery finds them;
    variables already set are kept. Under torchrun and the deepspeed launcher this changes nothing;
    under srun, mpiexec or horovodrun it lets torch.distributed's env:// find the other ranks. A
    process started without a launcher is rank 0 of 1."""
    cluster = detect_cluster()
    for name, value in (
        ("RANK", cluster.rank),
        ("WORLD_SIZE", cluster.world_size),
        ("LOCAL_RANK", cluster.local_rank),
        ("LOCAL_WORLD_SIZE", cluster.local_world_size),
        ("MASTER_ADDR", cluster.master_addr),
        ("MASTER_PORT", cluster.master_port),
    ):
        os.environ.setdefault(name, str(value))  # for good: the script's env:// and its children read them
    return cluster


def skip_deepspeed_shm_op() -> None:
    """Start DeepSpeed's communication layer without its CPU shared-memory allreduce op.

    On Linux CPUs DeepSpeed 0.19 JIT-compiles that op when deepspeed.init_distributed() runs (about
    45 s the first time) and maps a 66 MB /dev/shm segment per rank that it never frees; only
    inference uses it. The harness's DeepSpeed backend goes without it for the same reasons (see
    DeepSpeedBackend.init). On GPUs DeepSpeed never builds it, so this changes nothing there.
    """
    from ..backends.compat import deepspeed_shm_op_stand_in

    comm_torch, stand_ins = deepspeed_shm_op_stand_in()
    for name, stand_in in stand_ins.items():
        setattr(comm_torch, name, stand_in)
