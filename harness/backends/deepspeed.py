"""DeepSpeed: the engine owns model and optimizer; ZeRO stages 0-3."""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, Dict, Tuple

import torch
from torch import nn

from ..cluster import ClusterEnv
from ..config import TrainConfig
from ..errors import UsageError, first_line
from .base import OptimizerFactory
from .torch_distributed import TorchDistributedBackend

NO_PRINT = 1 << 30


def deepspeed_config(config: TrainConfig, local_batch: int, world_size: int) -> Dict[str, Any]:
    """The DeepSpeed config the harness passes, with every math-changing default set explicitly."""
    return {
        # DeepSpeed's batch is global; the harness's --batch-size is per worker.
        "train_micro_batch_size_per_gpu": local_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": local_batch * world_size,
        # DeepSpeed clips at norm 1.0 unless told otherwise; DDP and Horovod do not clip.
        "gradient_clipping": config.grad_clip,
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "zero_optimization": {"stage": config.zero_stage},
        # The harness passes a torch optimizer (DeepSpeed's own Adam JIT-compiles a C++ op on CPU).
        "zero_allow_untested_optimizer": True,
        "steps_per_print": NO_PRINT,
        "wall_clock_breakdown": False,
    }


def unlink_shm_allreduce_buffer(rank: int) -> None:
    """Remove the name of this rank's DeepSpeed CPU shm allreduce buffer; the mappings stay valid.

    On CPU, when all ranks are on one node (its launcher sets LOCAL_SIZE), DeepSpeed 0.19 creates a
    66 MB POSIX shared-memory segment per rank (csrc/cpu/comm/shm.cpp) and never unlinks it: every
    job left 66 MB per rank in /dev/shm, which is RAM, until the machine ran out. The harness never
    uses that allreduce (it serves inference), so each rank unlinks its own segment right after
    set-up, which frees it even when the job is later killed.
    """
    name = "_".join(["deepspeed_allreduce_buffer", str(os.getuid()), os.environ.get("MASTER_ADDR", ""),
                     os.environ.get("MASTER_PORT", ""), str(rank)])
    try:
        os.unlink(os.path.join("/dev/shm", name))
    except FileNotFoundError:  # not created: several nodes, a GPU accelerator, or no /dev/shm
        pass


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

    def init(self, cluster: ClusterEnv, device: torch.device, config: TrainConfig) -> None:
        if device.type == "cpu":
            # Must be set before DeepSpeed is imported: it picks its accelerator at import time.
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        super().init(cluster, device, config)
        self.zero_stage = config.zero_stage

    def wrap(self, model: nn.Module, make_optimizer: OptimizerFactory, config: TrainConfig,
             local_batch: int) -> Tuple[nn.Module, torch.optim.Optimizer]:
        import deepspeed
        import torch.distributed as dist

        engine, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=make_optimizer(model.parameters()),
            config=deepspeed_config(config, local_batch, dist.get_world_size()), dist_init_required=False)
        self.engine = engine
        self.optimizer = optimizer
        # Once every rank is past initialize, every rank has mapped its peers' shm buffers.
        dist.barrier()
        unlink_shm_allreduce_buffer(dist.get_rank())
        return engine, optimizer

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()  # applies clipping per the config, steps, and zeroes the gradients

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
        return {"zero_stage": self.zero_stage}

    def versions(self) -> Dict[str, str]:
        import deepspeed

        return {"deepspeed": deepspeed.__version__}
