"""The one interface every backend implements, and the single-process baseline.

A backend is a *strategy*: how the model and optimizer are wrapped and how ranks communicate.
Where rank and size come from is not its business (that is `harness.cluster`). The training loop
talks to this interface only, so it never asks which backend it runs.

DeepSpeed builds model and optimizer together, so `wrap` takes the model and a factory for the
optimizer and returns both.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Callable, ClassVar, Dict, Iterable, Optional, Tuple

import torch
from torch import nn

from ..cluster import ClusterEnv
from ..config import TrainConfig
from ..errors import UsageError, first_line

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

# How gradients of the ranks are combined, for every backend: the mean, so that N ranks with
# batch b take the same step as one process with batch N*b.
GRADIENT_AVERAGING = "mean over ranks"
MODEL_FILE = "model.pt"  # the default checkpoint's model and optimizer state


class Backend:
    """Single-process training; the base the distributed backends override piece by piece."""

    name: ClassVar[str] = "none"
    local_launcher: ClassVar[str] = "python"  # what `harness launch` uses on one machine
    library: ClassVar[Optional[str]] = None  # importable module this backend needs
    install_hint: ClassVar[str] = ""
    # Which files save_checkpoint writes; a checkpoint loads only into a backend of the same format.
    checkpoint_format: ClassVar[str] = "torch"

    def __init__(self) -> None:
        self.model: nn.Module
        self.optimizer: torch.optim.Optimizer
        self.grad_clip = 0.0

    # -- checks that run before any process group starts ---------------------------------
    def check_available(self) -> None:
        """Raise UsageError if the backend's library is missing or unusable."""
        if self.library and importlib.util.find_spec(self.library) is None:
            raise UsageError(f"backend {self.name!r} needs {self.library}, which is not installed; {self.install_hint}")

    def check_launch(self, config: TrainConfig, cluster: ClusterEnv) -> None:
        """Raise UsageError if this backend cannot run the config under this launch."""
        if cluster.world_size != 1:
            raise UsageError(f"backend 'none' runs one process but the launcher started {cluster.world_size}; "
                             "use --backend ddp, horovod or deepspeed, or launch one process")

    # -- set-up -----------------------------------------------------------------------------
    def init(self, cluster: ClusterEnv, device: torch.device, config: TrainConfig) -> None:
        """Join the job's communication (process group, MPI, ...)."""

    def wrap(self, model: nn.Module, make_optimizer: OptimizerFactory, config: TrainConfig,
             local_batch: int) -> Tuple[nn.Module, torch.optim.Optimizer]:
        """Return (model to call in training, optimizer whose param_groups take the LR)."""
        self.grad_clip = config.grad_clip
        self.model = model
        self.optimizer = make_optimizer(model.parameters())
        return self.model, self.optimizer

    # -- one training step ----------------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of `loss`, averaged over ranks by the time `step` applies them."""
        loss.backward()

    def finish_gradient_sync(self) -> None:
        """Block until this step's gradients are averaged over ranks.

        The training loop times backward + this call as one phase, the same way for every backend.
        Backends whose `backward` returns with averaged gradients (DDP, DeepSpeed) need nothing here.
        """

    def step(self) -> None:
        """Apply (and clear) the gradients, clipping their global norm when --grad-clip is set."""
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- communication for metrics and coordination -----------------------------------------
    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Elementwise sum of `tensor` over ranks (returned; the input may be reused)."""
        return tensor

    def start_all_reduce_sum(self, tensor: torch.Tensor, name: str) -> Callable[[], torch.Tensor]:
        """Start all_reduce_sum(tensor) in the background; the returned function waits for the sum.

        The collective overlaps whatever the rank computes meanwhile. Every rank must start its
        collectives in the same order, as with the blocking ones. `name` is the same for every
        call from one place (Horovod then negotiates it once); at most one per name is in flight.
        """
        total = self.all_reduce_sum(tensor)
        return lambda: total

    def barrier(self) -> None:
        """Wait until every rank gets here."""

    # -- results ----------------------------------------------------------------------------
    def module(self) -> nn.Module:
        """The plain model inside any wrapper."""
        return self.model

    def evaluation_model(self, make_model: Callable[[], nn.Module]) -> nn.Module:
        """A model each rank can run on its own, with no collective inside forward."""
        return self.module()

    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """The whole model's weights as plain CPU tensors (collective where weights are sharded)."""
        return {key: value.detach().cpu().clone() for key, value in self.module().state_dict().items()}

    # -- checkpoints and failures --------------------------------------------------------------
    def save_checkpoint(self, directory: str, rank: int) -> None:
        """Write model and optimizer state into `directory`; every rank calls it.

        Here rank 0 writes one file: every rank holds identical weights and optimizer state (the
        ranks apply the same averaged gradients). harness.checkpoint makes the directory atomic.
        """
        if rank == 0:
            torch.save({"model": self.module().state_dict(), "optimizer": self.optimizer.state_dict()},
                       os.path.join(directory, MODEL_FILE))

    def load_checkpoint(self, directory: str, device: torch.device) -> None:
        """Load what save_checkpoint wrote into the wrapped model and optimizer, on every rank."""
        from ..checkpoint import load_tensors

        path = os.path.join(directory, MODEL_FILE)
        state = load_tensors(path, device)
        try:
            self.module().load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise UsageError(f"checkpoint {directory} does not fit this model and optimizer ({first_line(exc)}); "
                             "resume with the run's own settings, or use another --checkpoint-dir") from None

    def is_peer_failure(self, error: BaseException) -> bool:
        """True if `error` says a collective failed because another rank died or stopped answering."""
        return False

    def math_settings(self, config: TrainConfig) -> Dict[str, Any]:
        """Every setting that changes the math, as applied; identical across backends by design."""
        return {
            "gradient_averaging": GRADIENT_AVERAGING,
            "gradient_clipping": config.grad_clip or None,
            "loss_scaling": None,
            "precision": "fp32",
            "buffer_sync": "none (batch-norm statistics stay per rank)",
            "gradient_compression": None,
        }

    def tuning(self) -> Dict[str, Any]:
        """The framework's performance knobs as applied (they change speed, not the math)."""
        return {}

    def versions(self) -> Dict[str, str]:
        """Versions of the libraries this backend used."""
        return {}

    def shutdown(self) -> None:
        """Leave the job's communication cleanly."""
