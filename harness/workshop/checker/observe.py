"""Inside each rank: watch the attendee's script run, and leave a record of what it did.

`run_rank` is what every rank of a check runs (through `python -m harness.workshop.checker`). It
places the rank on a simulated node of its own if asked (devices.simulate_nodes), bounds the
collectives of the script's framework (its backend's `script_hooks.limit_collective_waits`), installs a
RankObserver and runs the script with runpy in the rank's own working directory. The observer is
an ExerciseObserver (harness.workshop.exercise.add_observer: the flags parsed, the samples each
workshop.digits fetch served, the model workshop.build_model made, the sums workshop.evaluate
returned, what workshop.report reported) and also hooks every DataLoader pass over the digits,
torch's global optimizer-step hooks (the weights before the first step and after the last, the LR
of each step; for a resumable script, the optimizer's state before the first step and after the
last), the model's forward (the training loss, metrics.TrainLosses; the random state the first
training forward of the run and of each epoch draws from, seeds; the training forwards of each step
and the autocast dtype they ran under, autocast), the rank's stdout, the device it picks (devices),
the engine config it gives its framework (the backend's `watch_engine_config`) and the backward
passes that communicated (its `watch_gradient_syncs`). When the script ends, the observer writes
its record (observation.json, weights.pt), which `Observation.read` reads back in the checker.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import inspect
import json
import os
import runpy
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn, Optional

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader

from ...backends import Backend, backend_class
from ...errors import EXIT_OK, first_line
from ...process.allocator import reuse_freed_memory
from ...process.discovery import ClusterEnv, detect_cluster
from ...process.environment import patched_environ
from ...process.memory_cap import GIB, capped, data_segment_bytes
from .. import exercise
from .autocast import autocast_dtype
from .batch import batch_settings
from .control import RunDirectory, ask_peers_for_stacks, enable_stack_dumps
from .devices import Device, DeviceExpressions, simulate_nodes, watch_set_device, weights_device
from .metrics import StdoutTee, TrainLosses
from .seeds import random_state

EXIT_FAILED = 1
Fetch = tuple[str, int, int, list[int]]  # split, pass over it, counted steps before it, sample indices
Weights = dict[str, torch.Tensor]


def _split_of(dataset: Any) -> Optional[str]:
    """The workshop.digits split a dataset (or a Subset of one, however nested) serves, if any."""
    while dataset is not None and not isinstance(dataset, exercise.Digits):
        dataset = getattr(dataset, "dataset", None)
    return dataset.split if dataset is not None else None


def _snapshot(model: torch.nn.Module) -> Weights:
    """The model's whole weights on the CPU. A sharded (FSDP) weight is a DTensor holding this rank's
    piece: gathered whole, a collective, which every rank reaches at the same optimizer step."""
    return {name: _whole(value).detach().to("cpu", copy=True) for name, value in model.state_dict().items()}


def _whole(value: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _optimizer_state(optimizer: torch.optim.Optimizer) -> Weights:
    """The tensors of the optimizer's state (SGD's momentum buffers, Adam's moments) on the CPU, by
    parameter index and name: "0.momentum_buffer"."""
    return {
        f"{index}.{name}": _whole(value).detach().to("cpu", copy=True)
        for index, values in optimizer.state_dict()["state"].items()
        for name, value in values.items()
        if torch.is_tensor(value)
    }


def _optimizer_spec(optimizer: torch.optim.Optimizer) -> Optional[dict[str, Any]]:
    """The torch.optim class under whatever wraps it (Horovod subclasses it) and its settings."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.startswith("torch.optim") and cls is not torch.optim.Optimizer:
            accepted = inspect.signature(cls.__init__).parameters
            settings = {
                key: value
                for key, value in optimizer.param_groups[0].items()
                if key in accepted
                and key not in ("params", "lr")
                and isinstance(value, (bool, int, float, str, type(None)))
            }
            return {"class": cls.__name__, "settings": settings}
    return None


class RankObserver:
    """What one rank did, written as JSON (and the weights as a torch file) when the script ends.
    `place` is the rank's place as the script sees it; `is_peer_failure` tells an error caused by
    another rank (the script's backend says)."""

    def __init__(
        self,
        place: ClusterEnv,
        script: str,
        is_peer_failure: Callable[[BaseException], bool],
        keeps_weights: bool = True,
    ) -> None:
        self.rank, self.world_size, self.local_rank = place.rank, place.world_size, place.local_rank
        # Whole copies of the weights at the first and last step, for the judge; not in a memory run,
        # which is judged on finishing within its budget, and would hold them inside it.
        self.keeps_weights = keeps_weights
        self.script, self.script_path = script, os.path.abspath(script)
        self.is_peer_failure = is_peer_failure
        self.args: Optional[dict[str, Any]] = None
        self.model: Optional[torch.nn.Module] = None
        self.models_built = 0
        self.passes: dict[str, int] = collections.Counter()
        self.fetches: list[Fetch] = []
        self.fetched_for_step = 0  # training samples fetched since the last counted step
        self.steps: list[list[float]] = []  # per counted step: the LR of each parameter group
        self.optimizer: Optional[dict[str, Any]] = None
        self.start: Optional[Weights] = None
        self.final: Optional[Weights] = None
        self.error: Optional[dict[str, Any]] = None
        self.reports: list[tuple[int, list[float], list[float]]] = []  # epoch, train sums, test sums
        self.evaluations: list[list[float]] = []  # what each workshop.evaluate returned
        self.train_losses = TrainLosses()
        self.printed: list[str] = []  # what the rank wrote to stdout
        self.engine_configs: list[Optional[dict[str, int]]] = []  # batch settings given to the framework
        self.devices: list[Device] = []
        self.random_state: Optional[str] = None  # at the first training forward (seeds)
        self.pass_random_states: dict[int, Optional[str]] = {}  # at the first training forward of each pass
        self.autocast_dtypes: list[Optional[str]] = []  # those the training forwards ran under, each once
        self.optimizer_start: Optional[Weights] = None  # a resumable script's, before its first step
        self.optimizer_final: Optional[Weights] = None  # and after its last
        self.forwards_in_step = 0  # training forwards since the last counted step
        self.synced_in_step: set[int] = set()  # which of them had a backward that communicated
        self.gradient_syncs: list[tuple[int, int]] = []  # per counted step: (synced, forwards)
        self.device_expressions = DeviceExpressions(script)
        self.script_globals: Optional[dict[str, Any]] = None

    # harness.workshop.exercise.ExerciseObserver
    def arguments_parsed(self, args: argparse.Namespace) -> None:
        self.args = dict(vars(args))
        self._find_script_globals()

    def model_built(self, model: torch.nn.Module) -> None:
        self.models_built += 1
        self._find_script_globals()
        self._evaluate_device_expressions()  # the device set-up comes before the model, the group is up
        if self.model is not None:
            return
        self.model = model
        model.register_forward_pre_hook(self.before_forward)
        model.register_forward_hook(self.forward)
        if self.rank != 0:
            # As a rank seeded otherwise would draw them; the script's own random state is kept.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(7919 * self.rank)
                for module in model.modules():
                    if module is not model and hasattr(module, "reset_parameters"):
                        module.reset_parameters()

    def evaluated(self, sums: torch.Tensor) -> None:
        self.evaluations.append(sums.tolist())

    def reported(self, epoch: int, train_sums: torch.Tensor, test_sums: torch.Tensor) -> None:
        self.reports.append((int(epoch), train_sums.tolist(), test_sums.tolist()))

    def batch_fetched(self, split: str, indices: Sequence[int]) -> None:
        self.fetches.append((split, self.passes[split], len(self.steps), list(indices)))
        if split == "train":
            self.fetched_for_step += len(indices)
            self.train_losses.fetched(indices)

    # hooks
    def pass_started(self, split: str) -> None:
        self.passes[split] += 1

    def before_forward(self, module: torch.nn.Module, inputs: Any) -> None:
        if not (module.training and torch.is_grad_enabled() and self.fetched_for_step):
            return  # not a training forward
        self.forwards_in_step += 1
        if not (inputs and torch.is_tensor(inputs[0])):
            return
        device = inputs[0].device
        if self.passes["train"] not in self.pass_random_states:
            self.pass_random_states[self.passes["train"]] = random_state(device)
        if self.random_state is None:
            self.random_state = random_state(device)
        dtype = autocast_dtype(device)
        if dtype not in self.autocast_dtypes:
            self.autocast_dtypes.append(dtype)

    def gradients_synced(self) -> None:
        self.synced_in_step.add(self.forwards_in_step)

    def forward(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        self.train_losses.forward(self.passes["train"], module, output)

    def before_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self.fetched_for_step and self.start is None and self.model is not None:
            self.start = _snapshot(self.model) if self.keeps_weights else {}
            self.optimizer = _optimizer_spec(optimizer)
            self.devices += weights_device(self.model)
            if self._resumable:
                self.optimizer_start = _optimizer_state(optimizer)

    def after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if not self.fetched_for_step:
            return  # no batch fed it: an optimizer set-up step (Horovod), or a wrapper's outer step
        self.steps.append([float(group["lr"]) for group in optimizer.param_groups])
        self.gradient_syncs.append((len(self.synced_in_step), self.forwards_in_step))
        self.fetched_for_step, self.forwards_in_step = 0, 0
        self.synced_in_step = set()
        if self.model is not None and self.keeps_weights:
            self.final = _snapshot(self.model)
        if self._resumable:
            self.optimizer_final = _optimizer_state(optimizer)

    @property
    def _resumable(self) -> bool:
        """Whether the script takes the resume flags (a resume is judged on its optimizer's state)."""
        return bool(self.args) and "resume" in self.args

    def device_chosen(self, index: int, where: str) -> None:
        self.devices.append((index, where))

    def engine_config(self, config: Any) -> None:
        self.engine_configs.append(batch_settings(config))

    def _find_script_globals(self) -> None:
        """Keep the script's globals, from the first event it causes (they stay live until it ends)."""
        frame = sys._getframe(1)
        while frame is not None and self.script_globals is None:
            if os.path.abspath(frame.f_code.co_filename) == self.script_path:
                self.script_globals = frame.f_globals
            frame = frame.f_back

    def _evaluate_device_expressions(self) -> None:
        if self.script_globals is not None:
            self.devices += self.device_expressions.evaluate(self.script_globals)

    def failed(self, error: BaseException) -> None:
        """The script raised `error`; a clean SystemExit is not a failure."""
        if isinstance(error, SystemExit) and error.code in (0, None):
            return
        frames = [
            frame
            for frame in traceback.extract_tb(error.__traceback__)
            if os.path.abspath(frame.filename) == self.script_path
        ]
        where = frames[-1] if frames else None
        self.error = {
            "todo": isinstance(error, exercise.TodoNotDone),
            "type": type(error).__name__,
            "message": str(error) if isinstance(error, SystemExit) else first_line(error, 300),
            "line": where.lineno if where else None,
            "source": (where.line or "") if where else "",
            "peer": self.is_peer_failure(error),
            "time": time.time(),
        }

    def write(self, directory: Path) -> None:
        self._evaluate_device_expressions()  # those that only the script's end binds
        record = {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "args": self.args,
            "models_built": self.models_built,
            "fetches": self.fetches,
            "steps": self.steps,
            "optimizer": self.optimizer,
            "error": self.error,
            "reports": self.reports,
            "evaluations": self.evaluations,
            "train_losses": self.train_losses.sums,
            "printed": "".join(self.printed),
            "engine_configs": self.engine_configs,
            "devices": self.devices,
            "random_state": self.random_state,
            "gradient_syncs": self.gradient_syncs,
            "pass_random_states": self.pass_random_states,
            "autocast_dtypes": self.autocast_dtypes,
        }
        weights = {"start": self.start, "final": self.final}
        weights.update(optimizer_start=self.optimizer_start, optimizer_final=self.optimizer_final)
        torch.save(weights, directory / "weights.pt")
        (directory / "observation.json").write_text(json.dumps(record))


@dataclass
class Observation:
    """One rank's record, as RankObserver wrote it."""

    rank: int
    world_size: int
    local_rank: int
    args: Optional[dict[str, Any]]
    models_built: int
    fetches: list[Fetch]
    steps: list[list[float]]
    optimizer: Optional[dict[str, Any]]
    error: Optional[dict[str, Any]]
    reports: list[tuple[int, list[float], list[float]]]
    evaluations: list[list[float]]
    train_losses: dict[int, list[float]]  # pass over the training data -> [summed loss, samples]
    printed: str
    engine_configs: list[Optional[dict[str, int]]]
    devices: list[Device]
    start: Optional[Weights] = None
    final: Optional[Weights] = None
    random_state: Optional[str] = None
    gradient_syncs: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    pass_random_states: dict[int, Optional[str]] = dataclasses.field(default_factory=dict)
    autocast_dtypes: list[Optional[str]] = dataclasses.field(default_factory=list)
    optimizer_start: Optional[Weights] = None
    optimizer_final: Optional[Weights] = None

    @classmethod
    def read(cls, directory: Path) -> Optional[Observation]:
        """The record in `directory`; None if the rank left none (it never finished its script)."""
        try:
            record = json.loads((directory / "observation.json").read_text())
            weights = torch.load(directory / "weights.pt", weights_only=True)
        except (OSError, ValueError, RuntimeError):
            return None
        for name in ("fetches", "reports", "devices", "gradient_syncs"):  # JSON keeps tuples as lists
            record[name] = [tuple(entry) for entry in record[name]]
        for name in ("train_losses", "pass_random_states"):  # JSON keeps int keys as strings
            record[name] = {int(number): value for number, value in record[name].items()}
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in {**record, **weights}.items() if name in names})

    def passes(self, split: str) -> list[list[int]]:
        """The samples fetched in each pass over `split`, in order (fetches outside a DataLoader
        count as one pass of their own)."""
        grouped: dict[int, list[int]] = collections.OrderedDict()
        for fetch_split, number, _, indices in self.fetches:
            if fetch_split == split:
                grouped.setdefault(number, []).extend(indices)
        return list(grouped.values())

    def step_batches(self) -> list[list[int]]:
        """The training samples that fed each counted step."""
        batches: list[list[int]] = [[] for _ in self.steps]
        for split, _, step, indices in self.fetches:
            if split == "train" and step < len(batches):
                batches[step].extend(indices)
        return batches


def _watch(observer: RankObserver, framework: type[Backend]) -> None:
    """Have `observer` told what the script does: the workshop's events, each DataLoader pass over
    the digits, every optimizer step, the devices it sets, its framework's engine config, and what
    it writes to stdout."""
    exercise.add_observer(observer)
    unobserved = DataLoader.__iter__

    def observed(loader: DataLoader):
        split = _split_of(loader.dataset)
        if split is not None:
            observer.pass_started(split)
        return unobserved(loader)

    DataLoader.__iter__ = observed  # type: ignore[method-assign]
    register_optimizer_step_pre_hook(observer.before_step)
    register_optimizer_step_post_hook(observer.after_step)
    watch_set_device(observer.device_chosen)
    framework.script_hooks.watch_engine_config(observer.engine_config)
    framework.script_hooks.watch_gradient_syncs(observer.gradients_synced)
    sys.stdout = StdoutTee(sys.stdout, observer.printed.append)  # type: ignore[assignment]


def _run_script(observer: RankObserver, run: RunDirectory, script: str, script_args: Sequence[str]) -> int:
    """Run the script as __main__ with `script_args`; the rank's exit status (1 if it failed, its
    traceback printed)."""
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as error:  # the script's failure is what the check reports
        observer.failed(error)
        if observer.error is None:
            return EXIT_OK
        if observer.error["peer"]:
            ask_peers_for_stacks(run)  # where were the others? Asked before the launcher ends them
        if isinstance(error, SystemExit):
            print(error.code, file=sys.stderr)
        else:
            traceback.print_exc()
        return EXIT_FAILED
    return EXIT_OK


@contextlib.contextmanager
def _memory_budget(budget_mib: Optional[float]) -> Iterator[None]:
    """The rank capped at `budget_mib` MiB beyond its runtime's footprint (None: not capped), as
    --memory-cap caps a CPU rank (harness.process.memory_cap): its data segment, freed
    blocks handed back to the kernel. On the CPU on any machine, where the budget was measured: the
    script sees no GPU (CUDA reads the variable when the script first asks for a device)."""
    if budget_mib is None:
        yield
        return
    reuse_freed_memory("release")
    with patched_environ({"CUDA_VISIBLE_DEVICES": ""}):
        with capped((data_segment_bytes() + budget_mib * 2**20) / GIB, torch.device("cpu")):
            yield


def run_rank(
    run_dir: str,
    collective_timeout: float,
    backend: str,
    script: str,
    script_args: Sequence[str],
    nodes: int = 1,
    memory_budget_mib: Optional[float] = None,
) -> NoReturn:
    """One rank of a check: observe, run `script` with `script_args` in this rank's own working
    directory under the collective timeout of `backend` (the registry name of its framework), as if
    its ranks were dealt out to `nodes` nodes, write what was observed, and exit: with 1 if the
    script failed (its traceback printed), else 0. With `memory_budget_mib`, the script may hold that
    much memory beyond what the rank holds before it starts (_memory_budget)."""
    # First, before anything reads the launcher's variables or starts CUDA.
    place = simulate_nodes(nodes) if nodes > 1 else detect_cluster()
    run = RunDirectory(Path(run_dir))
    observations, files = run.observations(place.rank), run.files(place.rank)
    observations.mkdir(parents=True, exist_ok=True)
    files.mkdir(parents=True, exist_ok=True)
    enable_stack_dumps(observations)
    framework = backend_class(backend)
    framework.script_hooks.limit_collective_waits(collective_timeout)
    observer = RankObserver(place, script, framework.is_peer_failure, keeps_weights=memory_budget_mib is None)
    _watch(observer, framework)
    os.chdir(files)
    with _memory_budget(memory_budget_mib):
        status = _run_script(observer, run, script, script_args)
    observer.write(observations)
    # As harness.cli.run_and_exit: leave without interpreter finalization, whose library teardown
    # (gloo threads, Horovod's exit hooks) can take seconds, wait on a dead peer, or abort.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
