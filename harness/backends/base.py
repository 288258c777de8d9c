"""The one interface every backend implements.

A backend is a *strategy*: how the model and optimizer are wrapped and how ranks communicate.
Where rank and size come from is not its business (that is `harness.process.discovery`). The training loop
talks to this interface only, so it never asks which backend it runs.

The interface is abstract where forgetting an override would silently change the math: joining the
job, wrapping model and optimizer, and every collective. A new backend that forgets one cannot be
instantiated, instead of inheriting a single-process no-op (`SingleProcessBackend` in single.py is
a sibling, not the base). Concrete helpers here are the local parts every backend shares: loss
scaling for fp16, clipping and the optimizer step, checkpoint files written by rank 0.

DeepSpeed builds model and optimizer together, so `wrap` takes the model and a factory for the
optimizer and returns both. A backend receives what it uses of the run's configuration as a small
`BackendSettings` (harness.training.placement builds it), never the whole config.
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    ClassVar,
    Optional,
)

import torch
from torch import nn

from ..errors import UsageError, first_line, require
from ..fileio import load_tensors
from ..options import BaseOptions
from ..process.discovery import ClusterEnv
from ..process.environment import patched_environ
from .collectives import CollectiveMeter
from .precision import Precision
from .scripts import ScriptHooks
from .traffic import Collective, ModelShape

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass(frozen=True)
class BackendSettings:
    """What a backend uses of the run's configuration."""

    precision: str = "fp32"  # fp32, bf16 or fp16 (harness.backends.precision)
    grad_clip: float = 0.0  # clip the global gradient norm to this (0: no clipping)
    grad_accum: int = 1  # micro-batches per optimizer step; the last one communicates
    timeout: float = 120.0  # seconds a collective may wait for a peer
    procs_per_gpu: int = 1  # ranks sharing one GPU
    metered: bool = True  # every collective timed for the step breakdown (--no-step-breakdown: off)


# How gradients of the ranks are combined, for every backend: the mean, so that N ranks with
# batch b take the same step as one process with batch N*b.
GRADIENT_AVERAGING = "mean over ranks"
# A parameter the loss did not reach in a step (on any rank): Horovod and DeepSpeed average a zero
# gradient for it, and the optimizer then steps it (momentum, weight decay and Adam's moments move
# it); torch's optimizers skip a parameter whose gradient is None. Every backend does the former.
UNUSED_PARAMETERS = "stepped with a zero gradient"
MODEL_FILE = "model.pt"  # the default checkpoint's model and optimizer state


class Backend(abc.ABC):
    """How one rank trains with its peers. Subclasses set `name` and implement the abstract methods."""

    name: ClassVar[str]
    local_launcher: ClassVar[str]  # what `harness launch` uses on one machine
    # Every launcher it runs under on one machine (docs/reference/backends.md's table).
    local_launchers: ClassVar[tuple[str, ...]] = ("torchrun", "mpirun", "horovodrun", "deepspeed")
    max_world_size: ClassVar[Optional[int]] = None  # the single-process baseline runs one rank only
    library: ClassVar[Optional[str]] = None  # importable module this backend needs
    install_hint: ClassVar[str] = ""
    # Which files save_checkpoint writes; a checkpoint loads only into a backend of the same format.
    checkpoint_format: ClassVar[str] = "torch"
    # This backend's own options (harness.backends.options): a frozen dataclass whose fields are
    # `harness train` flags; a run's values come from TrainConfig.backend_options.
    Options: ClassVar[type[BaseOptions]] = BaseOptions
    # Whether --channels-last may store the weights channels-last too. A backend whose collectives
    # need contiguous tensors keeps the weights contiguous and only the images go channels-last
    # (cuDNN still computes channels-last when either operand is).
    channels_last_weights: ClassVar[bool] = True
    # The accelerator kinds (harness.process.accelerator.KINDS) this backend runs on: placement refuses
    # the others, naming the backends that run there. Each backend module declares its own.
    devices: ClassVar[tuple[str, ...]] = ("cuda", "cpu")
    # Whether --compile may compile the model under this backend (see `compile`).
    compiles: ClassVar[bool] = True
    # The threads a rank of this backend keeps busy besides its compute threads, each named: the
    # record counts them in the job's own demand for cores (harness.training.contention), so that
    # the job's own oversubscription is never taken for another process's load.
    helper_threads: ClassVar[tuple[str, ...]] = ()
    # What `harness check` uses to watch an attendee's script that runs this framework itself
    # (harness.backends.scripts): not part of a training run.
    script_hooks: ClassVar[type[ScriptHooks]] = ScriptHooks

    def __init__(self, options: Optional[BaseOptions] = None, settings: Optional[BackendSettings] = None) -> None:
        self.options = options if options is not None else self.Options()
        self.settings = settings if settings is not None else BackendSettings()
        self.model: nn.Module
        self.optimizer: torch.optim.Optimizer
        self.precision = Precision.of(self.settings.precision)
        self.scaler: Optional[torch.amp.GradScaler] = None
        self.skipped_steps = 0  # fp16 steps skipped because the gradients overflowed
        self.compiled: Optional[str] = None  # what --compile compiled, for the record's tuning
        self._undo = contextlib.ExitStack()  # what init/wrap changed in the process, undone by shutdown
        # Every collective the run issues, timed (harness.backends.collectives): each backend feeds it,
        # the step timer reads it (harness.training.timing).
        self.collectives = CollectiveMeter()

    # -- checks that run before any process group starts ---------------------------------
    @classmethod
    def parse_options(cls, values: Mapping[str, Any]) -> BaseOptions:
        """This backend's options from their values by field name (TrainConfig.backend_options),
        validated; an unknown name or a malformed value raises UsageError."""
        return cls.Options.parse(f"backend {cls.name!r}", values)

    def check_unused_parameters(self, names: list[str]) -> None:
        """Raise UsageError if this backend cannot train a model whose parameters `names` got no
        gradient from a step's loss (harness.training.probe finds them on the first batch)."""

    @property
    def reaches_same_parameters(self) -> bool:
        """Whether every rank must reach the same parameters in every step: a backend that gathers
        or reduces per module or per parameter present (ZeRO-1..3, FSDP) issues other collectives
        on a rank that skipped one, and aborts or waits. The loop then checks, once at start-up,
        that the ranks' first batches left the same parameters unused."""
        return False

    @property
    def forward_gathers(self) -> bool:
        """Whether the model's forward is a collective (it gathers sharded weights: ZeRO-3, FSDP), so
        that every rank must run as many forwards as its peers: the evaluation then keeps the ranks
        in step (harness.training.evaluate), where each would otherwise score a block of its own size."""
        return False

    def after_evaluation(self) -> None:
        """Called on every rank once an evaluation's forwards are done: a backend whose forward
        gathers weights puts them back as training and saving expect them."""

    def check_available(self) -> None:
        """Raise UsageError if the backend's library is missing or unusable."""
        if self.library:
            require(self.library, f"backend {self.name!r}", self.install_hint, load=False)

    def build_info(self) -> dict[str, bool]:
        """What the installed library was built with, where that varies between installations
        (Horovod: its controllers and GPU operations); checked by `harness study --check` against
        what a site needs. Call after check_available."""
        return {}

    @abc.abstractmethod
    def check_launch(self, cluster: ClusterEnv, device: torch.device) -> None:
        """Raise UsageError if this backend cannot run its settings under this launch on this device."""

    # -- set-up -----------------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, cluster: ClusterEnv, device: torch.device) -> None:
        """Join the job's communication (process group, MPI, ...), or use what the caller set up."""

    @abc.abstractmethod
    def wrap(
        self, model: nn.Module, make_optimizer: OptimizerFactory, local_batch: int
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Return (model to call in training, optimizer whose param_groups take the LR)."""

    def compile(self, model: nn.Module) -> nn.Module:
        """The model to train under --compile: `model`, as wrap returned it, under torch.compile
        (compiled in its first call). Wrapped first, then compiled, as PyTorch recommends for DDP:
        dynamo splits the graph at DDP's buckets so their allreduces still overlap backward, and
        hooks on the parameters (Horovod's, the step timer's) still fire after the compiled backward."""
        self.compiled = f"torch.compile({type(model).__name__})"
        return torch.compile(model)

    def _local_setup(self) -> None:
        """What every backend applies to its own step once the model is wrapped: fp16's loss scaling."""
        self.scaler = self.precision.grad_scaler(next(self.model.parameters()).device)

    def _set_environ(self, **values: str) -> None:
        """Set environment variables for this run; shutdown puts back what was there."""
        self._undo.enter_context(patched_environ(values))

    def _set_attributes(self, owner: Any, **values: Any) -> None:
        """Set library-level defaults for this run; shutdown puts back the previous values."""
        for name, value in values.items():
            self._undo.callback(setattr, owner, name, getattr(owner, name))
            setattr(owner, name, value)

    # -- one training step ----------------------------------------------------------------
    def no_sync(self, sync: bool) -> AbstractContextManager:
        """Context for one micro-batch's forward and backward; with sync=False its gradients stay
        local (gradient accumulation: only the step's last micro-batch communicates)."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        """Add the gradients of `loss` (scaled for fp16) to the parameters' gradients; when `sync`,
        they are averaged over ranks by the time `step` applies them."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def finish_gradient_sync(self) -> None:
        """Block until this step's gradients are averaged over ranks.

        The training loop times backward + this call as one phase, the same way for every backend.
        Backends whose `backward` returns with averaged gradients (DDP, DeepSpeed) need nothing here.
        """

    def step(self) -> None:
        """Apply (and clear) the gradients: unscale (fp16), clip the global norm when --grad-clip is
        set, step the optimizer (an fp16 step whose gradients overflowed is skipped and counted). A
        parameter without a gradient is stepped with a zero one (UNUSED_PARAMETERS)."""
        zero_missing_gradients(self.optimizer)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.settings.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        with self._applying_gradients():
            if self.scaler is None:
                self.optimizer.step()
            else:
                scale = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.skipped_steps += self.scaler.get_scale() < scale  # the scale backs off after an overflow
        self.optimizer.zero_grad()  # torch's sets gradients to None; Horovod's takes no arguments

    def _applying_gradients(self) -> AbstractContextManager:
        """Context around the optimizer's step (Horovod's must not average the gradients again)."""
        return contextlib.nullcontext()

    # -- communication for metrics and coordination -----------------------------------------
    @abc.abstractmethod
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of `tensor` over ranks (returned; the input may be reused)."""

    @abc.abstractmethod
    def start_all_reduce_sum(self, tensor: torch.Tensor, name: str) -> Callable[[], torch.Tensor]:
        """Start all_reduce_sum(tensor) in the background; the returned function waits for the sum.

        The collective overlaps whatever the rank computes meanwhile. Every rank must start its
        collectives in the same order, as with the blocking ones. `name` is the same for every
        call from one place (Horovod then negotiates it once); at most one per name is in flight.
        """

    @abc.abstractmethod
    def barrier(self) -> None:
        """Wait until every rank gets here."""

    # -- results ----------------------------------------------------------------------------
    def module(self) -> nn.Module:
        """The plain model inside any wrapper."""
        return self.model

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights as plain CPU tensors (collective where weights are sharded)."""
        return {key: value.detach().cpu().clone() for key, value in self.module().state_dict().items()}

    # -- checkpoints and failures --------------------------------------------------------------
    def save_checkpoint(self, directory: str, rank: int) -> None:
        """Write model and optimizer state into `directory`; every rank calls it.

        Here rank 0 writes one file: every rank holds identical weights and optimizer state (the
        ranks apply the same averaged gradients). harness.training.checkpoint makes the directory atomic.
        """
        if rank == 0:
            state = {"model": self.module().state_dict(), "optimizer": self.optimizer.state_dict()}
            if self.scaler is not None:
                state["scaler"] = self.scaler.state_dict()
            torch.save(state, os.path.join(directory, MODEL_FILE))

    def load_checkpoint(self, directory: str, device: torch.device) -> None:
        """Load what save_checkpoint wrote into the wrapped model and optimizer, on every rank."""
        path = os.path.join(directory, MODEL_FILE)
        state = load_tensors(path, device)
        try:
            self.module().load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None:
                self.scaler.load_state_dict(state["scaler"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise UsageError(
                f"checkpoint {directory} does not fit this model and optimizer ({first_line(exc)}); "
                "resume with the run's own settings, or use another --checkpoint-dir"
            ) from None

    @classmethod
    def usage_error(cls, error: BaseException) -> Optional[UsageError]:
        """The one-line UsageError for a framework error that means bad input the harness could not
        see before the run (DDP: a parameter no step's loss reached), else None."""
        return None

    @classmethod
    def is_peer_failure(cls, error: BaseException) -> bool:
        """True if `error` says a collective failed because another rank died or stopped answering
        (whether it came from this backend or from a script using the framework directly)."""
        return False

    def math_settings(self) -> dict[str, Any]:
        """Every setting that changes the math, as applied; identical across backends by design."""
        return {
            "gradient_averaging": GRADIENT_AVERAGING,
            "gradient_clipping": self.settings.grad_clip or None,
            "gradient_accumulation": self.settings.grad_accum,
            **self.precision.record(),
            "buffer_sync": "none (batch-norm statistics stay per rank; evaluation and saving use rank 0's)",
            "unused_parameters": UNUSED_PARAMETERS,
            "gradient_compression": None,
        }

    def tuning(self) -> dict[str, Any]:
        """The framework's performance knobs as applied (they change speed, not the math)."""
        return {}

    @abc.abstractmethod
    def traffic(self, shape: ModelShape, on_gpu: bool = True) -> list[Collective]:
        """The collectives one optimizer step runs under this backend's options on a model of
        `shape`, in the order they are issued (harness.backends.traffic): what a cost model prices.
        `on_gpu` False: ranks on CPUs, where a framework that overlaps through device streams cannot."""

    def versions(self) -> dict[str, str]:
        """Versions of the libraries this backend used."""
        return {}

    def shutdown(self) -> None:
        """Leave the job's communication cleanly and undo what init and wrap changed in the process
        (environment variables, library defaults), so that the next run starts as the first did."""
        self._undo.close()


def zero_missing_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter of `optimizer` that has no gradient a zero one (UNUSED_PARAMETERS)."""
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            if parameter.grad is None and parameter.requires_grad:
                parameter.grad = torch.zeros_like(parameter)
