"""PyTorch FSDP2 (`torch.distributed.fsdp.fully_shard`): weights, gradients and optimizer state
sharded over the ranks, checkpoints sharded through torch.distributed.checkpoint.

Each top-level child of the model that holds parameters is one FSDP unit (its weights are
all-gathered for its forward and backward, its gradients reduce-scattered after its backward),
and the root is one more for the parameters left over. Every FSDP default that changes the
math is set explicitly (`fsdp_math`) and recorded under the record's `math`: weights stay float32
and torch.autocast casts inside forward, as under the other backends (harness.backends.precision),
and gradients are summed in float32, then divided by the world size.

In the step breakdown (harness.training.timing), every all-gather and reduce-scatter is timed
where FSDP issues and waits for it (harness.backends.collectives): its wait is communication,
wherever in forward or backward it falls.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from ..errors import UsageError, first_line
from ..options import BaseOptions, option
from ..process.discovery import ClusterEnv
from .base import OptimizerFactory
from .collectives import TORCH_COLLECTIVES
from .scripts import recording
from .torch_distributed import TorchDistributedBackend, TorchDistributedScriptHooks
from .traffic import Collective, ModelShape

DCP_DIRECTORY = "dcp"  # inside a harness checkpoint: torch.distributed.checkpoint's .metadata and one file per rank


def fsdp_math(world_size: int) -> dict[str, Any]:
    """FSDP's settings that change the math, as the backend applies them.

    MixedPrecisionPolicy: no parameter or output cast (param_dtype float32 is the weights' own
    dtype, so FSDP casts nothing; autocast does the casting, as for the other backends) and
    reduce_dtype float32, so gradients are averaged in float32 as everywhere else. The reduction:
    FSDP would pick ReduceOp.AVG or a pre-multiplied sum by dtype and world size; forced to a sum
    followed by one division by the world size, the mean over ranks the other backends take.
    """
    return {
        "param_dtype": "float32",
        "reduce_dtype": "float32",
        "output_dtype": None,
        "cast_forward_inputs": False,
        "gradient_reduction": "sum, then divide by world size",
        "gradient_divide_factor": float(world_size),
    }


def _first_failure(error: BaseException) -> BaseException:
    """The error a rank met inside torch.distributed.checkpoint. It raises CheckpointException, a
    BaseException (the loop's `except Exception` would miss it) holding each failed rank's error:
    the first of those, so that a peer's failure (or a full disk) reaches the loop as itself."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        return next(iter(failures.values()))[0]
    return error


class FSDPScriptHooks(TorchDistributedScriptHooks):
    """A script's FSDP2 models tell each reduce-scatter of gradients they issue."""

    @classmethod
    def watch_gradient_syncs(cls, record: Callable[[], None]) -> None:
        # FSDP2 reduce-scatters a unit's gradients after its backward, through torch.distributed's
        # reduce-scatter functions (looked up on the module when called; their name changes with
        # the torch version), except where set_requires_gradient_sync(False) keeps them on the rank.
        # A script's own collectives (the weights' broadcast, the metrics' all-reduce, the
        # all-gathers of a full state dict) are none of these.
        for name, (kind, *_) in TORCH_COLLECTIVES.items():
            if kind == "reduce_scatter" and hasattr(dist, name):
                setattr(dist, name, recording(getattr(dist, name), record))


class FSDPBackend(TorchDistributedBackend):
    """fully_shard per top-level child and on the root; the harness's own step, clipping and loss scaling."""

    name = "fsdp"
    checkpoint_format = "torch.distributed.checkpoint"
    script_hooks = FSDPScriptHooks
    # FSDP2 shards every weight along dim 0 into contiguous shards and all-gathers them into
    # contiguous buffers, so a channels-last weight would not stay channels-last.
    channels_last_weights = False
    # FSDP2 shards over the mesh of the run's device type: NCCL (RCCL on ROCm) or XCCL, and gloo on CPU.
    devices = ("cuda", "rocm", "xpu", "cpu")

    @dataclass(frozen=True)
    class Options(BaseOptions):
        """FSDP's knob: whether a unit frees its gathered weights after forward (speed and memory
        only, not the math; one all-gather per unit and step less when kept)."""

        keep_gathered: bool = option(
            False,
            "--fsdp-keep-gathered",
            "fsdp: keep each unit's gathered weights from forward to backward "
            "(reshard_after_forward=False: more memory, fewer all-gathers)",
        )

        @property
        def reshard_after_forward(self) -> bool:
            return not self.keep_gathered

        @classmethod
        def examples(cls) -> tuple[FSDPBackend.Options, ...]:
            # Kept gathered, a unit's weights are all-gathered once per step instead of twice.
            return (cls(), cls(keep_gathered=True))

    options: Options

    def check_launch(self, cluster: ClusterEnv, device: torch.device) -> None:
        super().check_launch(cluster, device)
        # Several ranks on one GPU would put FSDP2's all-gathers and reduce-scatters of CUDA tensors
        # on gloo (process_group_backend): untested, and DDP shares a GPU already.
        if device.type == "cuda" and self.settings.procs_per_gpu > 1:
            raise UsageError(
                "backend 'fsdp' needs one rank per GPU (NCCL); use --procs-per-gpu 1, "
                "or --backend ddp to share a GPU between ranks"
            )

    def wrap(
        self, model: nn.Module, make_optimizer: OptimizerFactory, local_batch: int
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        device = next(model.parameters()).device
        world_size = dist.get_world_size()
        # An explicit mesh on the run's device type: FSDP's default mesh is CUDA whenever a GPU is
        # visible, even for a run on the CPU.
        mesh = init_device_mesh(device.type, (world_size,))
        policy = MixedPrecisionPolicy(
            param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=None, cast_forward_inputs=False
        )
        # FSDP2 warns when a unit returns a view (the workshop CNN's feature block ends in Flatten):
        # an in-place op on that view would skip the unit's backward hook. Here such a view feeds the
        # next unit's forward, never an in-place op, so the warning would only clutter every log.
        self._undo.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        # fully_shard keeps this rank's piece of its own copy and broadcasts nothing: rank 0's weights
        # first, as DDP's constructor does, so that no rank's own draw ends up in the model.
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        units = [child for child in model.children() if any(True for _ in child.parameters())]
        for unit in units + [model]:
            fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=self.options.reshard_after_forward)
        model.set_gradient_divide_factor(float(world_size))
        model.set_force_sum_reduction_for_comms(True)
        self.model = model
        self.optimizer = make_optimizer(model.parameters())
        self._local_setup()
        self.units = units
        return self.model, self.optimizer

    @property
    def reaches_same_parameters(self) -> bool:
        return True  # a unit that runs on one rank only reduce-scatters alone

    @property
    def forward_gathers(self) -> bool:
        return True

    def compile(self, model: nn.Module) -> nn.Module:
        """Each unit's forward compiled, FSDP's hooks around it left eager. torch.compile of the root,
        or Module.compile of a unit, traces FSDP's hooks first, which dynamo refuses to trace
        ("skipping FSDP hooks"), and then ran nothing compiled at all (measured: weights
        bit-identical to an uncompiled run); a compiled forward moves the weights as DDP's compiled
        model does (4.5e-4 of the update from the uncompiled run's after 10 steps, bound 1e-3)."""
        for unit in self.units:
            unit.forward = torch.compile(unit.forward)
        self.compiled = f"torch.compile of the forward of {len(self.units)} FSDP units"
        return model

    def no_sync(self, sync: bool) -> AbstractContextManager:
        # Set before every micro-batch: a non-final one keeps its unsharded gradients local and
        # accumulates them; the final one reduce-scatters the sum, one communication per step.
        self.model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()

    def math_settings(self) -> dict[str, Any]:
        return {**super().math_settings(), "fsdp": fsdp_math(dist.get_world_size())}

    def traffic(self, shape: ModelShape, on_gpu: bool = True) -> list[Collective]:
        # Per unit (a top-level child): its weights gathered before its forward, gathered again
        # before its backward unless kept, and its gradients reduce-scattered after. FSDP2 issues
        # them without async_op and overlaps them through its own CUDA streams (prefetching the next
        # unit's gathers); on CPUs there are no streams, so each call holds the compute.
        units = shape.units()
        calls = [Collective("all_gather", size, 1, "forward_gather", on_gpu) for size in units]
        if self.options.reshard_after_forward:
            calls += [Collective("all_gather", size, 1, "backward_gather", on_gpu) for size in units[::-1]]
        return calls + [Collective("reduce_scatter", size, 1, "backward_reduce", on_gpu) for size in units[::-1]]

    def tuning(self) -> dict[str, Any]:
        return {
            "reshard_after_forward": self.options.reshard_after_forward,
            "fsdp_units": len(self.units) + 1,
            "process_group": self.group_backend,
        }

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # Every rank gathers every weight (a collective on every rank, as the loop calls it).
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True))
        # Each gathered tensor dropped once copied: the rank holds the whole model once, not twice.
        return {key: state.pop(key).detach().cpu().clone() for key in list(state)}

    def save_checkpoint(self, directory: str, rank: int) -> None:
        import torch.distributed.checkpoint as dcp

        # Every rank writes its own shards of weights and optimizer state; no rank gathers the model.
        try:
            dcp.save(self._checkpoint_state(), checkpoint_id=os.path.join(directory, DCP_DIRECTORY))
        except dcp.CheckpointException as exc:
            raise _first_failure(exc) from exc

    def load_checkpoint(self, directory: str, device: torch.device) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._checkpoint_state()
        try:
            dcp.load(state, checkpoint_id=os.path.join(directory, DCP_DIRECTORY))
            set_state_dict(
                self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        except (dcp.CheckpointException, RuntimeError, KeyError, ValueError, OSError) as exc:
            cause = _first_failure(exc)
            if self.is_peer_failure(cause):
                raise cause from exc
            raise UsageError(
                f"FSDP cannot load checkpoint {directory} ({first_line(cause)}); resume with the "
                "run's own settings, or use another --checkpoint-dir"
            ) from None
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])

    def _checkpoint_state(self) -> dict[str, Any]:
        """This rank's shards of model and optimizer state (and the fp16 scaler), keyed as DCP stores them."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_state, "optimizer": optimizer_state}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state
