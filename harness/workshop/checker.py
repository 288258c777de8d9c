"""`harness check FILE`: run an attendee's data-parallel script at 2 ranks and say what is wrong.

How the script runs. Its imports tell its framework (deepspeed, else horovod, else torch.distributed)
and so its real launcher (the deepspeed launcher, horovodrun, torchrun). Every rank runs
`python -m harness.checker`, which installs the observers below and then runs the script (runpy)
in an empty working directory of its own, with fixed flags: seed 0, dropout off, 2 epochs of the
first 5 G + 10 training images, where G = ranks x 16 is the global batch (5 steps an epoch, 10 in
all: harness.equivalence's EQUIVALENCE_STEPS; the 10 left over are the drop-last tail), and
--lr 0.05 / ranks, so that the global batch trains at harness.equivalence's measured LR 0.05.
Collectives time out (gloo, Horovod, DeepSpeed) well before the check does, and at the check's
timeout every rank dumps its Python stack and is killed: a hung script ends with where it hung.

What it watches, per rank (harness.workshop.OBSERVERS and two hooks):
- the samples fetched from workshop.digits, per pass over a DataLoader (a training pass is an
  epoch, a test pass an evaluation) and per optimizer step;
- the model built by workshop.build_model. On every rank but 0 its weights are drawn anew, as
  ranks seeded differently would draw them: only a broadcast from rank 0 makes them start alike;
- the weights before the first step and after the last, the LR of every step (torch's global
  optimizer-step hooks; a step that no training batch fed, such as Horovod's state set-up, is not
  counted); the flags parsed; the files written into the rank's working directory; its error.

What must hold (one FAIL line each, naming the TODO that governs it):
1. every rank starts from rank 0's weights, and ends with the same weights;
2. those weights are what one process trains on the same global batches (the union of the ranks'
   batches at each step) at the same LRs, within harness.equivalence's UPDATE_BOUND of the update;
   if not, the usual causes are tried to name it: gradients summed instead of averaged, or
   clipped at norm 1.0 (DeepSpeed's default);
3. the LR is --lr x ranks at every step (a warmup script: from --lr up to that, linearly per step);
4. every epoch the ranks train on disjoint samples that leave out fewer than one global batch,
   in a new order each epoch; every evaluation scores each test image exactly once;
5. only rank 0 writes files, and it saves the model to --save;
6. only rank 0 reports (workshop.report), with the sums and counts of all ranks: every test image
   and every sample trained that epoch.
Weights are compared with the observed LRs and batches, so each mistake fails one property only.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import faulthandler
import inspect
import json
import logging
import os
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import exercise as workshop
from ..backends.torch_distributed import GLOO_FAILURE_MARKERS
from ..process.discovery import detect_cluster
from ..study.equivalence import EQUIVALENCE_STEPS, UPDATE_BOUND, update_differences, worst
from ..errors import EXIT_OK, UsageError, first_line
from ..process.launchers import launch_environment, launcher_command
from ..training.models import WorkshopCNN

log = logging.getLogger("harness")

CHECK_BATCH = 16  # per rank
CHECK_EPOCHS = 2
STEPS_PER_EPOCH = EQUIVALENCE_STEPS // CHECK_EPOCHS
LEFTOVER_SAMPLES = 10  # after the last full global batch of an epoch: the drop-last tail
GLOBAL_LR = 0.05  # the LR of the global batch (harness.equivalence measured its bound at this LR)
CLIP_NORM = 1.0  # DeepSpeed's default gradient_clipping
SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"
STACK_DUMP_WAIT_S = 2.0
EXIT_FAILED = 1
# Errors a rank raises because another rank died or left: the other rank's error is the cause.
PEER_ERROR_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError", "HorovodInternalError")


@dataclass(frozen=True)
class Framework:
    """What a script's imports tell: how to launch it, which solution numbers its TODOs, and the
    TODO keys (harness.workshop's convention) that govern the weights' properties."""

    label: str
    imports: "re.Pattern[str]"
    launcher: str
    solution: str
    start_keys: Tuple[str, ...]  # every rank starts from rank 0's weights
    sync_keys: Tuple[str, ...]  # the gradients are averaged over the ranks
    clip_keys: Tuple[str, ...]  # gradient clipping


FRAMEWORKS = (  # in the order they are recognised: a DeepSpeed script imports torch.distributed too
    Framework("DeepSpeed", re.compile(r"^\s*(import|from)\s+deepspeed\b", re.M), "deepspeed", "04_deepspeed.py",
              ("initialize",), ("engine-step",), ("config",)),
    Framework("Horovod", re.compile(r"^\s*(import|from)\s+horovod\b", re.M), "horovodrun", "03_horovod.py",
              ("broadcast",), ("optimizer",), ("optimizer",)),
    Framework("PyTorch DDP", re.compile(r"^\s*(import\s+torch\.(distributed|nn\.parallel)\b"
                                        r"|from\s+torch\.(distributed|nn\.parallel)\b"
                                        r"|from\s+torch\s+import\s+distributed\b)", re.M),
              "torchrun", "02_ddp.py", ("wrap",), ("wrap",), ("wrap",)),
)


def framework_of(source: str, path: str) -> Framework:
    """The framework a script's imports name; UsageError if none."""
    for framework in FRAMEWORKS:
        if framework.imports.search(source):
            return framework
    raise UsageError(f"{path} imports none of deepspeed, horovod, torch.distributed: harness check runs "
                     "data-parallel scripts such as exercises/02_ddp.py (run a serial one with python)")


# ---------------------------------------------------------------------------------------------
# On every rank: observe, then run the script.


def _split_of(dataset: Any) -> Optional[str]:
    """The workshop.digits split a dataset (or a Subset of one, however nested) serves, if any."""
    while dataset is not None and not isinstance(dataset, workshop.Digits):
        dataset = getattr(dataset, "dataset", None)
    return dataset.split if dataset is not None else None


def _snapshot(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {name: value.detach().to("cpu", copy=True) for name, value in model.state_dict().items()}


def _optimizer_spec(optimizer: torch.optim.Optimizer) -> Optional[Dict[str, Any]]:
    """The torch.optim class under whatever wraps it (Horovod subclasses it) and its settings."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls is not torch.optim.Optimizer:
            accepted = inspect.signature(cls.__init__).parameters
            settings = {key: value for key, value in optimizer.param_groups[0].items()
                        if key in accepted and key not in ("params", "lr")
                        and isinstance(value, (bool, int, float, str, type(None)))}
            return {"class": cls.__name__, "settings": settings}
    return None


class RankObserver:
    """What one rank did, written as JSON (and the weights as a torch file) when the script ends."""

    def __init__(self, rank: int, world_size: int, script: str) -> None:
        self.rank, self.world_size, self.script = rank, world_size, script
        self.args: Optional[Dict[str, Any]] = None
        self.model: Optional[torch.nn.Module] = None
        self.models_built = 0
        self.passes: Dict[str, int] = collections.Counter()
        self.fetches: List[Tuple[str, int, int, List[int]]] = []  # split, pass, step, indices
        self.fetched_for_step = 0  # training samples fetched since the last counted step
        self.steps: List[List[float]] = []  # per counted step: the LR of each parameter group
        self.optimizer: Optional[Dict[str, Any]] = None
        self.start: Optional[Dict[str, torch.Tensor]] = None
        self.final: Optional[Dict[str, torch.Tensor]] = None
        self.error: Optional[Dict[str, Any]] = None
        self.reports: List[Tuple[int, List[float], List[float]]] = []  # epoch, train sums, test sums

    # harness.workshop's observer interface
    def arguments_parsed(self, args: argparse.Namespace) -> None:
        self.args = dict(vars(args))

    def model_built(self, model: torch.nn.Module) -> None:
        self.models_built += 1
        if self.model is not None:
            return
        self.model = model
        if self.rank != 0:
            # As a rank seeded otherwise would draw them; the script's own random state is kept.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(7919 * self.rank)
                for module in model.modules():
                    if module is not model and hasattr(module, "reset_parameters"):
                        module.reset_parameters()

    def reported(self, epoch: int, train_sums: torch.Tensor, test_sums: torch.Tensor) -> None:
        self.reports.append((int(epoch), train_sums.tolist(), test_sums.tolist()))

    def batch_fetched(self, split: str, indices: Sequence[int]) -> None:
        self.fetches.append((split, self.passes[split], len(self.steps), list(indices)))
        if split == "train":
            self.fetched_for_step += len(indices)

    # hooks
    def pass_started(self, split: str) -> None:
        self.passes[split] += 1

    def before_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self.fetched_for_step and self.start is None and self.model is not None:
            self.start = _snapshot(self.model)
            self.optimizer = _optimizer_spec(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if not self.fetched_for_step:
            return  # no batch fed it: an optimizer set-up step (Horovod), or a wrapper's outer step
        self.steps.append([float(group["lr"]) for group in optimizer.param_groups])
        self.fetched_for_step = 0
        if self.model is not None:
            self.final = _snapshot(self.model)

    def failed(self, error: BaseException) -> None:
        if isinstance(error, SystemExit) and error.code in (0, None):
            return
        frames = [frame for frame in traceback.extract_tb(error.__traceback__)
                  if os.path.abspath(frame.filename) == os.path.abspath(self.script)]
        where = frames[-1] if frames else None
        self.error = {"todo": isinstance(error, workshop.TodoNotDone), "type": type(error).__name__,
                      "message": str(error) if isinstance(error, SystemExit) else first_line(error, 300),
                      "line": where.lineno if where else None, "source": (where.line or "") if where else "",
                      "time": time.time()}

    def write(self, directory: Path) -> None:
        record = {"rank": self.rank, "world_size": self.world_size, "args": self.args,
                  "models_built": self.models_built, "fetches": self.fetches, "steps": self.steps,
                  "optimizer": self.optimizer, "error": self.error, "reports": self.reports}
        torch.save({"start": self.start, "final": self.final}, directory / "weights.pt")
        (directory / "observation.json").write_text(json.dumps(record))


def _observe_loader_passes(observer: RankObserver) -> None:
    from torch.utils.data import DataLoader

    unobserved = DataLoader.__iter__

    def observed(loader: DataLoader):
        split = _split_of(loader.dataset)
        if split is not None:
            observer.pass_started(split)
        return unobserved(loader)

    DataLoader.__iter__ = observed  # type: ignore[method-assign]


def _bound_collectives(seconds: float) -> None:
    """Make a rank that waits for a peer give up after `seconds`, in every framework."""
    from torch.distributed import distributed_c10d

    timeout = datetime.timedelta(seconds=seconds)
    distributed_c10d.default_pg_timeout = timeout
    distributed_c10d.default_pg_nccl_timeout = timeout
    os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(seconds)))
    os.environ["DEEPSPEED_TIMEOUT"] = str(max(1, round(seconds / 60)))  # minutes; its own default is 10


def run_rank(run_dir: str, collective_timeout: float, script: str, script_args: Sequence[str]) -> NoReturn:
    """One rank of a check: observe, run `script` with `script_args` in this rank's own working
    directory, write what was observed, and exit: with 1 if the script failed (its traceback
    printed), else 0."""
    rank_env = detect_cluster()
    observations = Path(run_dir, "observations", f"rank-{rank_env.rank}")
    files = Path(run_dir, "files", f"rank-{rank_env.rank}")
    observations.mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)
    (observations / "pid").write_text(str(os.getpid()))
    stack_file = open(observations / "stack.txt", "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=False)
    _bound_collectives(collective_timeout)
    observer = RankObserver(rank_env.rank, rank_env.world_size, script)
    workshop.OBSERVERS.append(observer)
    _observe_loader_passes(observer)
    register_optimizer_step_pre_hook(observer.before_step)
    register_optimizer_step_post_hook(observer.after_step)
    os.chdir(files)
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    status = EXIT_OK
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as error:  # the script's failure is what the check reports
        observer.failed(error)
        if observer.error is not None and _is_peer_error(observer.error):
            # Where were the others? Ask them for their stacks before the launcher ends them.
            for pid in _rank_pids(Path(run_dir)):
                if pid != os.getpid():
                    _signal(pid, signal.SIGUSR1)
            time.sleep(STACK_DUMP_WAIT_S / 4)
        if observer.error is not None:
            status = EXIT_FAILED
            if isinstance(error, SystemExit):
                print(error.code, file=sys.stderr)
            else:
                traceback.print_exc()
    observer.write(observations)
    # As harness.cli.run_and_exit: leave without interpreter finalization, whose library teardown
    # (gloo threads, Horovod's exit hooks) can take seconds, wait on a dead peer, or abort.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# ---------------------------------------------------------------------------------------------
# In the checker: launch, then judge.


@dataclass
class Observation:
    """One rank's record, as RankObserver wrote it."""

    rank: int
    args: Optional[Dict[str, Any]]
    models_built: int
    fetches: List[Tuple[str, int, int, List[int]]]
    steps: List[List[float]]
    optimizer: Optional[Dict[str, Any]]
    error: Optional[Dict[str, Any]]
    start: Optional[Dict[str, torch.Tensor]]
    final: Optional[Dict[str, torch.Tensor]]
    reports: List[Tuple[int, List[float], List[float]]]

    @classmethod
    def read(cls, directory: Path) -> Optional["Observation"]:
        try:
            record = json.loads((directory / "observation.json").read_text())
            weights = torch.load(directory / "weights.pt", weights_only=True)
        except (OSError, ValueError, RuntimeError):
            return None
        return cls(record["rank"], record["args"], record["models_built"], [tuple(f) for f in record["fetches"]],
                   record["steps"], record["optimizer"], record["error"], weights["start"], weights["final"],
                   [tuple(report) for report in record["reports"]])

    def passes(self, split: str) -> List[List[int]]:
        """The samples fetched in each pass over `split`, in order (fetches outside a DataLoader
        count as one pass of their own)."""
        grouped: Dict[int, List[int]] = collections.OrderedDict()
        for fetch_split, number, _, indices in self.fetches:
            if fetch_split == split:
                grouped.setdefault(number, []).extend(indices)
        return list(grouped.values())

    def step_batches(self) -> List[List[int]]:
        """The training samples that fed each counted step."""
        batches: List[List[int]] = [[] for _ in self.steps]
        for split, _, step, indices in self.fetches:
            if split == "train" and step < len(batches):
                batches[step].extend(indices)
        return batches


@dataclass(frozen=True)
class Failure:
    """A property that does not hold: what was observed, and the TODO keys that govern it."""

    name: str
    observed: str
    keys: Tuple[str, ...]


@dataclass
class CheckResult:
    """What `check_script` found. `status` is the exit status (0 passed, 1 failed); `lines` what
    `harness check` prints; `weights` rank 0's final weights (None if the run did not finish)."""

    status: int
    lines: List[str]
    failures: List[Failure] = field(default_factory=list)
    weights: Optional[Dict[str, torch.Tensor]] = None

    @property
    def passed(self) -> bool:
        return self.status == EXIT_OK


class TodoIndex:
    """TODO numbers and titles by key, read from the solutions the exercises are made from."""

    def __init__(self, script_name: str, framework: Framework, warmup: bool) -> None:
        self.framework = framework
        names = [script_name] if (SOLUTIONS / script_name).is_file() else []
        if warmup:
            names += [path.name for path in sorted(SOLUTIONS.glob("*.py")) if "# TODO(warmup)" in path.read_text()]
        names.append(framework.solution)
        self.solutions = list(dict.fromkeys(names))

    def describe(self, keys: Sequence[str]) -> str:
        """ "TODO 4 of 02_ddp.py: wrap the model ..." for each key, from the first solution that exercises it."""
        found = []
        for key in keys:
            for name in self.solutions:
                path = SOLUTIONS / name
                blocks = workshop.todo_blocks(path.read_text(), name) if path.is_file() else []
                block = next((block for block in blocks if block.key == key and block.number is not None), None)
                if block is not None:
                    found.append(f"TODO {block.number} of {name}: {block.title}")
                    break
            else:
                found.append(f"the TODO({key}) block of {self.framework.solution}")
        return "; ".join(found)


def _collective_timeout(timeout: float) -> float:
    return min(120.0, max(20.0, timeout / 4))


def _script_flags(ranks: int) -> List[str]:
    samples = STEPS_PER_EPOCH * CHECK_BATCH * ranks + LEFTOVER_SAMPLES
    return ["--epochs", str(CHECK_EPOCHS), "--batch-size", str(CHECK_BATCH), "--lr", repr(GLOBAL_LR / ranks),
            "--seed", "0", "--dropout", "0", "--train-samples", str(samples), "--save", "model.pt"]


def _rank_pids(run_dir: Path) -> List[int]:
    pids = []
    for path in run_dir.glob("observations/rank-*/pid"):
        try:
            pid = int(path.read_text())
            if "harness.checker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                pids.append(pid)
        except (OSError, ValueError):
            continue  # already gone
    return pids


def _run(command: List[str], run_dir: Path, timeout: float) -> Tuple[Optional[int], bool]:
    """Run the launcher; (exit status, timed out). At the timeout every rank dumps its stack, then
    the launcher's session and every rank are killed."""
    environment = launch_environment()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)  # a launcher's variables from around `harness check` must not leak in
    with open(run_dir / "output.log", "w") as output:
        process = subprocess.Popen(command, cwd=run_dir, env=environment, stdout=output, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return process.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            for pid in _rank_pids(run_dir):
                _signal(pid, signal.SIGUSR1)
            time.sleep(STACK_DUMP_WAIT_S)
            return None, True
        finally:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait()
            for pid in _rank_pids(run_dir):  # ranks a launcher started in sessions of their own
                _signal(pid, signal.SIGKILL)


def _signal(pid: int, signal_number: int) -> None:
    try:
        os.kill(pid, signal_number)
    except ProcessLookupError:
        pass


def _where(line: Optional[int], source: str, script: str) -> str:
    return f" at line {line} of {os.path.basename(script)} ({source.strip()})" if line else ""


def _stuck_at(run_dir: Path, rank: int, script: str) -> str:
    """Where a rank's stack dump says it was in the script, most recent frame first."""
    try:
        dump = (run_dir / "observations" / f"rank-{rank}" / "stack.txt").read_text()
    except OSError:
        return "an unknown place (it left no stack dump)"
    for match in re.finditer(r'File "(?P<file>[^"]+)", line (?P<line>\d+)', dump):
        if os.path.abspath(match["file"]) == os.path.abspath(script):
            number = int(match["line"])
            lines = Path(script).read_text().splitlines()
            return f"line {number} ({lines[number - 1].strip()})" if number <= len(lines) else f"line {number}"
    return "a place outside the script" if dump.strip() else "an unknown place (it left no stack dump)"


def _is_peer_error(error: Dict[str, Any]) -> bool:
    return error["type"] in PEER_ERROR_TYPES or any(marker in error["message"] for marker in GLOO_FAILURE_MARKERS)


def _run_failure(observations: Dict[int, Optional[Observation]], ranks: int, status: Optional[int], timed_out: bool,
                 timeout: float, run_dir: Path, script: str) -> Optional[str]:
    """The one line that says why the run did not finish, or None if every rank finished its script."""
    errors = [(rank, observation.error) for rank, observation in observations.items()
              if observation is not None and observation.error is not None]
    todos = [error for _, error in errors if error["todo"]]
    if todos:
        return todos[0]["message"]
    output = f"(output: {run_dir / 'output.log'})"
    if errors:
        causes = [entry for entry in errors if not _is_peer_error(entry[1])] or errors
        rank, error = min(causes, key=lambda entry: entry[1]["time"])
        waiting = ""
        if _is_peer_error(error):
            others = ", ".join(f"rank {other} was at {_stuck_at(run_dir, other, script)}"
                               for other in range(ranks) if other != rank)
            waiting = (f"; it waited in vain for another rank ({others}): every rank must make the same "
                       "collective calls")
        message = re.sub(r"^\[[^\]]*\]\s*", "", error["message"])  # gloo's source-file tag
        return (f"rank {rank} stopped with {error['type']}: {message}"
                f"{_where(error['line'], error['source'], script)}{waiting} {output}")
    if timed_out:
        places = ", ".join(f"rank {rank} at {_stuck_at(run_dir, rank, script)}" for rank in range(ranks))
        return f"the run did not finish within {timeout:g} s: {places} {output}"
    missing = [rank for rank in range(ranks) if observations.get(rank) is None]
    if missing:
        return (f"rank {', '.join(map(str, missing))} never finished the script (launcher exit status {status}; "
                f"killed, or the launcher failed to start it) {output}")
    return None


# --- the properties ---------------------------------------------------------------------------


def _max_gap(weights: Dict[str, torch.Tensor], reference: Dict[str, torch.Tensor]) -> float:
    return max((weights[name].double() - value.double()).abs().max().item() for name, value in reference.items())


def _check_weights(observations: List[Observation], framework: Framework) -> Tuple[List[Failure], bool]:
    """Property 1; also whether the ranks agree (then property 2 can be judged on rank 0's weights)."""
    first = observations[0]
    for observation in observations[1:]:
        if _max_gap(observation.start, first.start) > 1e-6 * max(v.abs().max().item() for v in first.start.values()):
            gap = _max_gap(observation.start, first.start)
            return [Failure("same start", f"the ranks started training from different weights (rank "
                                          f"{observation.rank}'s differ from rank 0's by up to {gap:.3g}): every rank "
                                          "must start from rank 0's weights", framework.start_keys)], False
    for observation in observations[1:]:
        name, value = worst(update_differences(observation.final, first.final, first.start))
        if value > UPDATE_BOUND:
            return [Failure("same end", f"the ranks started alike but ended with different weights (rank "
                                        f"{observation.rank}'s differ from rank 0's by {value:.3g} of the update, in "
                                        f"{name}): the gradients are not averaged over the ranks",
                            framework.sync_keys)], False
    return [], True


def _train_reference(start: Dict[str, torch.Tensor], batches: List[List[int]], lrs: List[float],
                     optimizer: Dict[str, Any], train_samples: Optional[int],
                     gradients: Callable[[torch.nn.Module], None] = lambda model: None) -> Dict[str, torch.Tensor]:
    """One process trained on `batches` at `lrs` from `start`; `gradients` may change the
    gradients before each step (to try a suspected mistake)."""
    data = workshop.digits("train", train_samples)
    model = WorkshopCNN(dropout=0.0)
    model.load_state_dict(start)
    reference = getattr(torch.optim, optimizer["class"])(model.parameters(), lr=lrs[0], **optimizer["settings"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the launched ranks may still be exiting; more threads only contend on few cores
    try:
        for indices, lr in zip(batches, lrs):
            for group in reference.param_groups:
                group["lr"] = lr
            rows = torch.tensor(indices)
            loss = F.cross_entropy(model(data.images[rows]), data.labels[rows])
            reference.zero_grad()
            loss.backward()
            gradients(model)
            reference.step()
    finally:
        torch.set_num_threads(threads)
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def _check_one_process(observations: List[Observation], framework: Framework, ranks: int) -> List[Failure]:
    """Property 2, on rank 0's weights (the ranks agree)."""
    first = observations[0]
    if first.optimizer is None or not hasattr(torch.optim, first.optimizer["class"]):
        return [Failure("one process", "the checker found no torch.optim optimizer stepping the model, so it cannot "
                                       "train the one-process reference", framework.sync_keys)]
    per_rank = [observation.step_batches() for observation in observations]
    batches = [sum((rank_batches[step] for rank_batches in per_rank), []) for step in range(len(first.steps))]
    lrs = [step[0] for step in first.steps]
    train_samples = first.args.get("train_samples") if first.args else None

    def distance(**mistake: Any) -> Tuple[str, float]:
        trained = _train_reference(first.start, batches, lrs, first.optimizer, train_samples, **mistake)
        return worst(update_differences(first.final, trained, first.start))

    name, value = distance()
    if value <= UPDATE_BOUND:
        return []
    batch = len(batches[0])
    observed = (f"rank 0's weights differ from one process trained on the same {batch}-sample global batches at "
                f"the same LRs by {value:.3g} of the update (in {name}; at most {UPDATE_BOUND:g})")

    def scaled(model: torch.nn.Module) -> None:
        for parameter in model.parameters():
            parameter.grad.mul_(ranks)

    def clipped(model: torch.nn.Module) -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)

    if distance(gradients=scaled)[1] <= UPDATE_BOUND:
        return [Failure("one process", f"{observed}; they match one process whose gradients are {ranks}x larger: "
                                       "the gradients are summed over the ranks, not averaged", framework.sync_keys)]
    if distance(gradients=clipped)[1] <= UPDATE_BOUND:
        return [Failure("one process", f"{observed}; they match one process that clips the gradient norm at "
                                       f"{CLIP_NORM:g} (DeepSpeed's default gradient_clipping): turn clipping off",
                        framework.clip_keys)]
    return [Failure("one process", observed, framework.sync_keys + framework.clip_keys
                    if framework.clip_keys != framework.sync_keys else framework.sync_keys)]


def _expected_lrs(args: Dict[str, Any], steps: int, steps_per_epoch: int, ranks: int) -> List[List[float]]:
    """The LR of each step a correct script uses: --lr x ranks; with --warmup-epochs, the linear
    ramp to it from --lr, reached at warmup step W (counted from 0 or from 1: both are accepted)."""
    base, target = args["lr"], args["lr"] * ranks
    warmup = round((args.get("warmup_epochs") or 0) * steps_per_epoch)
    if not warmup:
        return [[target]] * steps
    return [[base + (target - base) * min(1.0, (step + offset) / warmup) for offset in (0, 1)]
            for step in range(steps)]


def _check_lr(observations: List[Observation], ranks: int) -> List[Failure]:
    """Property 3."""
    first = observations[0]
    if not first.args or "lr" not in first.args:
        return [Failure("learning rate", "the script did not read its flags with workshop.parse_args, so the "
                                         "checker cannot tell its --lr", ("lr",))]
    expected = _expected_lrs(first.args, len(first.steps), _steps_in_first_epoch(first), ranks)
    warmup = "warmup_epochs" in first.args and expected and len(expected[0]) > 1
    for observation in observations:
        for step, (used, allowed) in enumerate(zip(observation.steps, expected)):
            lr = used[0]
            if any(abs(lr - value) <= 1e-6 * abs(value) for value in allowed):
                continue
            target = first.args["lr"] * ranks
            rule = (f"one process on the {ranks}x larger global batch trains at --lr x {ranks} = {target:g}")
            if not warmup or abs(observation.steps[-1][0] - target) > 1e-6 * target:
                return [Failure("learning rate", f"rank {observation.rank} used LR {lr:g} at step {step + 1} "
                                                 f"(--lr {first.args['lr']:g}); {rule}", ("lr",))]
            return [Failure("learning rate", f"rank {observation.rank} used LR {lr:g} at step {step + 1}; the warmup "
                                             f"must climb linearly from --lr {first.args['lr']:g} at the first step "
                                             f"to {target:g} after {_warmup_steps(first)} "
                                             "steps, then stay there", ("warmup",))]
    return []


def _steps_in_first_epoch(observation: Observation) -> int:
    first_pass = next((number for split, number, _, _ in observation.fetches if split == "train"), None)
    return len({step for split, number, step, _ in observation.fetches
                if split == "train" and number == first_pass and step < len(observation.steps)})


def _warmup_steps(observation: Observation) -> int:
    return round((observation.args.get("warmup_epochs") or 0) * _steps_in_first_epoch(observation))


def _check_training_data(observations: List[Observation], ranks: int) -> List[Failure]:
    """Property 4, training: disjoint shards covering all but the tail, same steps, a new order every epoch."""
    failures = []
    first = observations[0]
    steps = {observation.rank: len(observation.steps) for observation in observations}
    if len(set(steps.values())) > 1:
        counts = ", ".join(f"rank {rank} {count}" for rank, count in steps.items())
        failures.append(Failure("shards", f"the ranks took different numbers of optimizer steps ({counts}): "
                                          "every rank must take the same number", ("shard",)))
    epochs = [observation.passes("train") for observation in observations]
    if not epochs[0]:
        return failures + [Failure("shards", "no rank fetched a training sample from workshop.digits('train', ...)",
                                   ("shard",))]
    if len({len(passes) for passes in epochs}) > 1:
        counts = ", ".join(f"rank {rank} {len(passes)}" for rank, passes in enumerate(epochs))
        return failures + [Failure("shards", f"the ranks made different numbers of passes over the training data "
                                             f"({counts})", ("shard",))]
    samples = first.args.get("train_samples") if first.args else None
    samples = samples or len(workshop.digits("train"))
    global_batch = ranks * (first.args.get("batch_size", CHECK_BATCH) if first.args else CHECK_BATCH)
    for epoch, shards in enumerate(zip(*epochs), 1):
        counts = collections.Counter(index for shard in shards for index in shard)
        repeated = [index for index, count in counts.items() if count > 1]
        if repeated:
            owners = [rank for rank, shard in enumerate(shards) if repeated[0] in shard]
            same = all(shard == shards[0] for shard in shards)
            how = ("every rank trained on the same samples" if same else
                   f"{len(repeated)} training samples were trained on more than once (sample {repeated[0]} by "
                   f"rank{'s' if len(owners) > 1 else ''} {', '.join(map(str, owners))})")
            failures.append(Failure("shards", f"in epoch {epoch} {how}: each rank must train on its own part of "
                                              "the epoch's samples", ("shard",)))
            break
        unseen = samples - len(counts)
        if unseen >= global_batch:
            failures.append(Failure("shards", f"in epoch {epoch} {unseen} of the {samples} training samples were "
                                              f"trained on by no rank; only the fewer than {global_batch} after the "
                                              "last full global batch may be left out", ("shard",)))
            break
    if len(epochs[0]) > 1 and not failures:
        repeating = [rank for rank, passes in enumerate(epochs) if passes[1] == passes[0]]
        if repeating:
            who = "every rank" if len(repeating) == ranks else f"rank {', '.join(map(str, repeating))}"
            failures.append(Failure("reshuffle", f"{who} trained epoch 2 in exactly the order of epoch 1: the data "
                                                 "must be reshuffled every epoch", ("reshuffle",)))
    return failures


def _check_evaluation(observations: List[Observation]) -> List[Failure]:
    """Property 4, evaluation: every test image scored exactly once per evaluation."""
    evaluations = [observation.passes("test") for observation in observations]
    size = len(workshop.digits("test"))
    if not any(evaluations):
        return [Failure("evaluation", "no rank scored a test image from workshop.digits('test')", ("eval-shard",))]
    for number in range(max(len(passes) for passes in evaluations)):
        counts = collections.Counter(index for passes in evaluations if number < len(passes)
                                     for index in passes[number])
        scored = sum(counts.values())
        repeated = [index for index, count in counts.items() if count > 1]
        missing = size - len(counts)
        if not repeated and not missing:
            continue
        if repeated and all(count == counts[repeated[0]] for count in counts.values()) and not missing:
            how = f"scored each of the {size} test images {counts[repeated[0]]} times"
        elif repeated:
            how = (f"scored {scored} images for {size}: {len(repeated)} of them more than once (image {repeated[0]} "
                   f"{counts[repeated[0]]} times; DistributedSampler pads with repeated images)")
        else:
            how = f"scored {len(counts)} of the {size} test images; {missing} were scored by no rank"
        return [Failure("evaluation", f"evaluation {number + 1} {how}: every test image must be scored exactly once",
                        ("eval-shard",))]
    return []


def _check_files(run_dir: Path, ranks: int, save: str) -> List[Failure]:
    """Property 5."""
    failures = []
    for rank in range(1, ranks):
        written = sorted(str(path.relative_to(run_dir / "files" / f"rank-{rank}"))
                         for path in (run_dir / "files" / f"rank-{rank}").rglob("*") if path.is_file())
        if written:
            failures.append(Failure("rank 0 writes", f"rank {rank} wrote {', '.join(written[:3])}"
                                                     f"{' ...' if len(written) > 3 else ''}: only rank 0 writes files",
                                    ("save",)))
            break
    if not (run_dir / "files" / "rank-0" / save).is_file():
        failures.append(Failure("rank 0 writes", f"rank 0 did not save the model to --save {save}", ("save",)))
    return failures


def _check_reports(observations: List[Observation]) -> List[Failure]:
    """Property 6: rank 0 alone reports, and what it reports adds up every rank's samples."""
    others = [observation.rank for observation in observations[1:] if observation.reports]
    if others:
        return [Failure("metrics", f"rank {others[0]} printed an epoch's line too (workshop.report): only rank 0 "
                                   "prints", ("metrics",))]
    test_size = len(workshop.digits("test"))
    epochs = [observation.passes("train") for observation in observations]
    trained = [sum(len(passes[epoch]) for passes in epochs if epoch < len(passes)) for epoch in range(len(epochs[0]))]
    for epoch, (_, train_samples), (_, _, test_samples) in observations[0].reports:
        if abs(test_samples - test_size) > 1e-6:
            return [Failure("metrics", f"rank 0 reported the test loss and accuracy of epoch {epoch + 1} over "
                                       f"{test_samples:g} images, not all {test_size}: add up the sums and counts of "
                                       "all ranks (not their averages)", ("metrics",))]
        if epoch < len(trained) and abs(train_samples - trained[epoch]) > 1e-6:
            return [Failure("metrics", f"rank 0 reported the training loss of epoch {epoch + 1} over "
                                       f"{train_samples:g} samples, but the ranks trained on {trained[epoch]}: add "
                                       "up the sums and counts of all ranks (not their averages)", ("metrics",))]
    return []


def _judge(observations: List[Observation], framework: Framework, ranks: int, run_dir: Path) -> List[Failure]:
    first = observations[0]
    failures: List[Failure] = []
    if not all(observation.models_built for observation in observations):
        failures.append(Failure("weights", "the checker saw no model built with workshop.build_model on every rank, "
                                           "so it cannot compare weights", framework.start_keys))
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
    failures += _check_files(run_dir, ranks, (first.args or {}).get("save", "model.pt"))
    failures += _check_reports(observations)
    return failures


# --- entry points ------------------------------------------------------------------------------


def _warm_up() -> None:
    """Load the digits (cached for the process) and what torch.optim imports on first use."""
    workshop.digits("test")
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=GLOBAL_LR)


def _script_to_run(path: Path, run_dir: Path) -> Path:
    if path.suffix == ".py":
        return path
    try:
        import jupytext
    except ImportError:
        raise UsageError("checking a notebook needs jupytext: pip install jupytext (make setup installs it)") from None
    script = run_dir / f"{path.stem}.py"
    script.write_text(jupytext.writes(jupytext.read(path), fmt="py:percent"))
    return script


def check_script(path: str, ranks: int = 2, timeout: float = 300.0) -> CheckResult:
    """Run the script (or notebook) at `path` on `ranks` local ranks under its framework's real
    launcher and judge it (the module docstring says how). Returns a CheckResult; raises
    UsageError for bad input (a missing file, no distributed framework imported, ranks < 2)."""
    source_path = Path(path)
    if not source_path.is_file():
        raise UsageError(f"{path} does not exist; give the path of your script, e.g. exercises/02_ddp.py")
    if source_path.suffix not in (".py", ".ipynb"):
        raise UsageError(f"{path} is neither a Python script (.py) nor a notebook (.ipynb)")
    if ranks < 2:
        raise UsageError(f"--ranks must be at least 2 to check data parallelism, got {ranks}")
    if not timeout > 0:
        raise UsageError(f"--timeout must be positive, got {timeout}")
    run_dir = Path(tempfile.mkdtemp(prefix="harness-check-"))
    keep_run_dir = False
    try:
        script = _script_to_run(source_path.resolve(), run_dir)
        framework = framework_of(script.read_text(), path)
        program = ["-m", "harness.checker", str(run_dir), repr(_collective_timeout(timeout)), str(script),
                   *_script_flags(ranks)]
        command = launcher_command(framework.launcher, ranks, program)
        log.info("harness check: %s at %d ranks under %s: %s", path, ranks, framework.launcher, shlex.join(command))
        # While the ranks run, this process loads what judging needs (seconds of its own otherwise).
        warm_up = threading.Thread(target=_warm_up, daemon=True)
        warm_up.start()
        status, timed_out = _run(command, run_dir, timeout)
        warm_up.join()
        observations = {rank: Observation.read(run_dir / "observations" / f"rank-{rank}") for rank in range(ranks)}
        stopped = _run_failure(observations, ranks, status, timed_out, timeout, run_dir, str(script))
        if stopped is not None:
            keep_run_dir = "output.log" in stopped
            return CheckResult(EXIT_FAILED, [f"FAIL run: {stopped}"])
        finished = [observations[rank] for rank in range(ranks)]
        warmup = bool(finished[0].args and "warmup_epochs" in finished[0].args)
        index = TodoIndex(source_path.with_suffix(".py").name, framework, warmup)
        failures = _judge(finished, framework, ranks, run_dir)
        weights = finished[0].final
        if failures:
            return CheckResult(EXIT_FAILED, [f"FAIL {failure.name}: {failure.observed} -> {index.describe(failure.keys)}"
                                             for failure in failures], failures, weights)
        return CheckResult(EXIT_OK, [_pass_line(finished, ranks)], [], weights)
    finally:
        if not keep_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def _pass_line(observations: List[Observation], ranks: int) -> str:
    first = observations[0]
    batch = len(first.step_batches()[0]) * ranks
    return (f"PASS: {ranks} ranks x {len(first.steps)} steps ended with the same weights, those of one process on "
            f"the same {batch}-sample global batches; each epoch every training sample went to one rank at most, "
            "in a new order; each evaluation scored every test image once; only rank 0 wrote files and reported, the "
            "sums of all ranks")


def check_command(path: str, ranks: int = 2, timeout: float = 300.0) -> int:
    """`harness check`: print the verdict lines and return the exit status (0 PASS, 1 FAIL; bad
    input raises UsageError, which the CLI prints as one line with status 2)."""
    result = check_script(path, ranks=ranks, timeout=timeout)
    for line in result.lines:
        print(line, flush=True)
    return result.status


def _main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.checker",
                                     description="one rank of `harness check` (started by its launcher)")
    parser.add_argument("run_dir")
    parser.add_argument("collective_timeout", type=float)
    parser.add_argument("script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    run_rank(args.run_dir, args.collective_timeout, args.script, args.script_args)


if __name__ == "__main__":
    _main(sys.argv[1:])
