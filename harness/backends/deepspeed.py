"""DeepSpeed: the engine owns model and optimizer; ZeRO stages 0-3."""

from __future__ import annotations

import importlib
import os
import pickle
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import distributed_c10d

from ..process.discovery import ClusterEnv
from ..errors import UsageError, first_line
from .precision import LOSS_SCALE, Precision
from .base import OptimizerFactory
from .torch_distributed import TorchDistributedBackend

if TYPE_CHECKING:
    from ..config import TrainConfig

NO_PRINT = 1 << 30
# DeepSpeed's names for the autocast dtypes of --precision.
AUTOCAST_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def deepspeed_config(config: "TrainConfig", local_batch: int, world_size: int) -> Dict[str, Any]:
    """The DeepSpeed config the harness passes, with every math-changing default set explicitly."""
    precision = Precision.of(config.precision)
    return {
        # DeepSpeed's batch is global; the harness's --batch-size is per worker and micro-batch.
        "train_micro_batch_size_per_gpu": local_batch // config.grad_accum,
        "gradient_accumulation_steps": config.grad_accum,
        "train_batch_size": local_batch * world_size,
        # DeepSpeed clips at norm 1.0 unless told otherwise; DDP and Horovod do not clip.
        "gradient_clipping": config.grad_clip,
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        # Its own fp16/bf16 modes keep half-precision weights: other math than autocast's.
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        # torch.autocast with float32 weights, as the other backends run it. An empty list of
        # "lower precision safe modules" keeps gradients in float32 when they are averaged
        # (DeepSpeed would otherwise send Linear and Conv gradients in the autocast dtype).
        **({"torch_autocast": {"enabled": True, "dtype": AUTOCAST_DTYPES[precision.autocast_dtype],
                               "lower_precision_safe_modules": []}} if precision.autocast_dtype else {}),
        "zero_optimization": {"stage": config.zero_stage},
        # The harness passes a torch optimizer (DeepSpeed's own Adam JIT-compiles a C++ op on CPU).
        "zero_allow_untested_optimizer": True,
        "steps_per_print": NO_PRINT,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer is on and synchronised by default: it waits for the GPU in
        # every forward and every step, so the host queues each step onto an idle GPU (seen on an
        # H100: 0.89 x a bare ResNet-50 loop, the host blocked 31 ms of a 69 ms step in
        # engine.step). The harness measures throughput itself, the same way for every backend.
        "timers": {"throughput": {"enabled": False}},
    }


def check_loss_scaler(scaler: Optional["torch.amp.GradScaler"]) -> None:
    """Fail loudly if DeepSpeed's fp16 loss scaler is missing or scales otherwise than the harness's."""
    if scaler is None:
        raise UsageError("this DeepSpeed has no torch_autocast loss scaler for --precision fp16; "
                         "use --precision bf16, or DeepSpeed 0.18 or newer")
    settings = {"init_scale": scaler.get_scale(), "growth_factor": scaler.get_growth_factor(),
                "backoff_factor": scaler.get_backoff_factor(), "growth_interval": scaler.get_growth_interval()}
    if settings != LOSS_SCALE:
        raise UsageError(f"DeepSpeed's fp16 loss scaler uses {settings}, the other backends {LOSS_SCALE}; "
                         "the frameworks would not compare fairly: use --precision bf16 or fp32")


def process_groups() -> FrozenSet[Any]:
    """Every process group torch knows in this process, the world group included.

    torch keeps its registry private: `distributed_c10d._world.pg_map` (torch 1.13 to 2.15 at least).
    tests/test_repeat_runs.py runs DeepSpeed repeatedly in one process and fails if this breaks.
    """
    return frozenset(distributed_c10d._world.pg_map)


def _no_shm_allreduce() -> None:
    """Stands in for deepspeed.comm.torch.build_shm_op (see DeepSpeedBackend.init)."""
    return None


def weights_only_checkpoint_engine():
    """DeepSpeed's torch checkpoint engine, loading with weights_only=True.

    DeepSpeed 0.19 loads its files with weights_only=False, which runs any pickled code. Its ZeRO
    files hold three of its own plain data classes besides tensors; those, and nothing else, are
    allowed.
    """
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location=None):
            with torch.serialization.safe_globals([LossScaler, ZeroStageEnum, fragment_address]):
                return torch.load(path, map_location=map_location, weights_only=True)

    return WeightsOnlyCheckpointEngine()


class DeepSpeedBackend(TorchDistributedBackend):
    """deepspeed.initialize on a torch optimizer; the harness sets the LR, no DeepSpeed scheduler."""

    name = "deepspeed"
    local_launcher = "deepspeed"
    library = "deepspeed"
    install_hint = "pip install deepspeed (or run `make setup`)"
    checkpoint_format = "deepspeed"
    options = ("zero_stage",)
    resume_must_match = ("zero_stage",)  # ZeRO's files are partitioned by stage
    # DeepSpeed 0.19 broadcasts each weight as raw bytes (p.data.view(torch.uint8)), which a
    # channels-last 4-D weight cannot give, and ZeRO flattens weights into contiguous buffers.
    channels_last_weights = False

    @classmethod
    def check_options(cls, config: "TrainConfig") -> None:
        if config.zero_stage not in (0, 1, 2, 3):
            raise UsageError(f"--zero-stage must be 0, 1, 2 or 3, got {config.zero_stage}")

    def init(self, cluster: ClusterEnv, device: torch.device, config: "TrainConfig") -> None:
        if device.type == "cpu":
            # Must be set before DeepSpeed is imported: it picks its accelerator at import time.
            self._set_environ(DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))
        # (deepspeed.comm's attribute `torch` is the torch package, so the module is looked up by name.)
        comm_torch = importlib.import_module("deepspeed.comm.torch")
        # On Linux CPUs DeepSpeed 0.19 JIT-compiles a shared-memory allreduce op when its comm layer
        # starts (about 45 s on a machine's first run) and, with every rank on one node, maps a 66 MB
        # /dev/shm segment per rank that it never unlinks. The op serves only inference's allreduce,
        # which training never calls, so the harness goes without it; the comm layer then uses
        # torch.distributed for everything, as on other platforms. Tested in tests/test_failures.py.
        if hasattr(comm_torch, "build_shm_op"):
            self._set_attributes(comm_torch, build_shm_op=_no_shm_allreduce)
        super().init(cluster, device, config)
        self.zero_stage = config.zero_stage
        self._groups_before_run = process_groups()

    def wrap(self, model: nn.Module, make_optimizer: OptimizerFactory, config: "TrainConfig",
             local_batch: int) -> Tuple[nn.Module, torch.optim.Optimizer]:
        import deepspeed

        device = next(model.parameters()).device
        # DeepSpeed moves the engine to GPU LOCAL_RANK unless told; with --procs-per-gpu K the
        # rank's GPU is local_rank // K, where the loop has put the model already.
        placement = SimpleNamespace(device_rank=device.index) if device.type == "cuda" else None
        engine, optimizer, _, _ = deepspeed.initialize(
            args=placement, model=model, optimizer=make_optimizer(model.parameters()),
            config=deepspeed_config(config, local_batch, dist.get_world_size()), dist_init_required=False)
        self.engine = self.model = engine
        self.optimizer = optimizer
        self.precision = Precision.of(config.precision)
        # DeepSpeed scales fp16 losses with a GradScaler of its own; the harness checks that it
        # scales as the other backends do, and reads it to count skipped steps.
        self.scaler = (getattr(engine, "torch_autocast_z0_gradscaler", None)
                       or getattr(optimizer, "torch_autocast_gradscaler", None))
        if self.precision.loss_scaling:
            check_loss_scaler(self.scaler)
        return engine, optimizer

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        # The loop has divided the loss by the number of micro-batches already, for every backend.
        self.engine.backward(loss, scale_wrt_gas=False)
        if not sync:
            # DeepSpeed counts micro-batches in step(): before the step's last micro-batch (its
            # accumulation boundary) step() only advances the count; it communicates and steps there.
            self.engine.step()

    def step(self) -> None:
        scale = self.scaler.get_scale() if self.scaler is not None else None
        self.engine.step()  # unscales and clips per the config, steps, and zeroes the gradients
        if scale is not None:
            self.skipped_steps += self.scaler.get_scale() < scale

    def module(self) -> nn.Module:
        return self.engine.module

    def save_checkpoint(self, directory: str, rank: int) -> None:
        # ZeRO partitions the optimizer state (stage 3 the weights too): every rank writes its own
        # part through DeepSpeed. The harness's own state is in files beside them, not client_state.
        parent, tag = os.path.split(os.path.abspath(directory))
        self.engine.save_checkpoint(parent, tag=tag, save_latest=False)

    def load_checkpoint(self, directory: str, device: torch.device) -> None:
        parent, tag = os.path.split(os.path.abspath(directory))
        self.engine.checkpoint_engine = weights_only_checkpoint_engine()
        try:
            loaded, _ = self.engine.load_checkpoint(parent, tag=tag, load_optimizer_states=True,
                                                    load_lr_scheduler_states=False)
        except (pickle.UnpicklingError, RuntimeError, KeyError, ValueError, AssertionError, OSError) as exc:
            if self.is_peer_failure(exc):
                raise
            raise UsageError(f"DeepSpeed cannot load checkpoint {directory} ({first_line(exc)}); resume with the run's "
                             "own settings, or use another --checkpoint-dir") from None
        if loaded is None:
            raise UsageError(f"DeepSpeed found no checkpoint in {directory}; resume from another one")

    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        if self.zero_stage < 3:
            return super().full_state_dict()
        import deepspeed

        module = self.engine.module
        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {key: value.detach().cpu().clone() for key, value in module.state_dict().items()}

    def evaluation_model(self, make_model: Callable[[], nn.Module]) -> nn.Module:
        if self.zero_stage < 3:
            return self.module()
        # ZeRO-3 gathers weights inside forward, a collective; ranks evaluate uneven shards, so
        # each evaluates a plain copy instead.
        device = next(self.engine.module.parameters()).device
        model = make_model()
        model.load_state_dict(self.full_state_dict())
        return model.to(device)

    def tuning(self) -> Dict[str, Any]:
        return {"zero_stage": self.zero_stage, "process_group": self.group_backend, "throughput_timer": False}

    def versions(self) -> Dict[str, str]:
        import deepspeed

        return {"deepspeed": deepspeed.__version__}

    def shutdown(self) -> None:
        self._release_deepspeed_groups()
        super().shutdown()

    def _release_deepspeed_groups(self) -> None:
        """Destroy the process groups DeepSpeed made during the run, and its references to them.

        DeepSpeed clones the world group (and ZeRO makes groups of its own) and keeps them in
        module-level caches for the life of the process. A second run in the same process (a
        notebook's engines) would find the clone of a group destroyed since, and fail in
        deepspeed.initialize with "Group ... is not registered"; in a group the caller owns, the
        clones would stay behind. deepspeed.comm.destroy_process_group releases DeepSpeed's
        references to the group it destroys.
        """
        before = getattr(self, "_groups_before_run", None)
        if before is None or not dist.is_initialized():
            return
        made = [group for group in process_groups() if group not in before]
        if not made:
            return
        comm = importlib.import_module("deepspeed.comm.comm")
        destroy = comm.destroy_process_group if comm.cdb is not None else dist.destroy_process_group
        for group in made:
            destroy(group)
