"""torch.distributed plumbing shared by the DDP and DeepSpeed backends."""

from __future__ import annotations

import datetime
import importlib
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from ..errors import UsageError
from ..process.accelerator import ONECCL_MODULE, communicator
from ..process.discovery import ClusterEnv
from . import compat
from .base import Backend
from .collectives import torch_distributed_wrappers
from .scripts import ScriptHooks

# Substrings of the errors gloo raises when a peer is gone: "Connection closed by peer", "Read error
# ...: Connection reset by peer", "Timed out waiting 20000ms for recv operation to complete", and
# "Application timeout caused pair closure" (a later collective on a connection that timed out).
GLOO_FAILURE_MARKERS = (
    "gloo/transport",
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "Application timeout caused pair closure",
)


def process_group_backend(device: torch.device, procs_per_gpu: int) -> str:
    """The device's communicator (harness.process.accelerator: NCCL/RCCL, XCCL or oneCCL, gloo on
    the CPU) for one rank per device. Several ranks sharing a GPU get gloo, as NCCL refuses them
    ("Duplicate GPU detected"; NVIDIA/nccl#418) and gloo reduces CUDA tensors through the host; gloo
    has no XPU tensors, so XPU ranks cannot share a device."""
    if procs_per_gpu == 1 or device.type == "cpu":
        return communicator(device.type)
    if device.type != "cuda":
        raise UsageError(
            f"--procs-per-gpu {procs_per_gpu} shares a device through gloo, which cannot reduce "
            f"{device.type} tensors; use --procs-per-gpu 1"
        )
    return "gloo"


class TorchDistributedScriptHooks(ScriptHooks):
    """A script's torch.distributed collectives bounded in time."""

    @classmethod
    def limit_collective_waits(cls, seconds: float) -> None:
        # The defaults of every group made without a timeout, init_process_group's included.
        for name, timeout in compat.group_timeout_defaults(seconds).items():
            setattr(distributed_c10d, name, timeout)


class TorchDistributedBackend(Backend):
    """A backend whose ranks talk through a torch.distributed process group (gloo or NCCL)."""

    # gloo runs each collective on a worker thread of the process group (ProcessGroupGloo), NCCL
    # drives the network from its proxy thread: one thread busy while the gradients move. Measured
    # on a 2-core machine, 2 ranks x 1 thread: CPU share 1.12-1.15 per rank under DDP.
    helper_threads = ("1 communication thread (the process group's)",)

    local_launcher = "torchrun"
    script_hooks = TorchDistributedScriptHooks

    def check_launch(self, cluster: ClusterEnv, device: torch.device) -> None:
        """Any launcher works: rank and size come from harness.process.discovery."""

    def init(self, cluster: ClusterEnv, device: torch.device) -> None:
        self.owns_process_group = not dist.is_initialized()
        port = compat.rendezvous_port(cluster.master_port) if self.owns_process_group else cluster.master_port
        # Export the discovered values under torchrun's names: libraries (DeepSpeed among them)
        # read these, whichever launcher actually started the process. Restored at shutdown.
        self._set_environ(
            RANK=str(cluster.rank),
            WORLD_SIZE=str(cluster.world_size),
            LOCAL_RANK=str(cluster.local_rank),
            LOCAL_WORLD_SIZE=str(cluster.local_world_size),
            MASTER_ADDR=cluster.master_addr,
            MASTER_PORT=str(port),
        )
        # The timeout bounds every collective: a dead peer fails the job instead of hanging it. It is
        # also the default of groups made later without one (compat.group_timeout_defaults says why).
        timeout = datetime.timedelta(seconds=self.settings.timeout)
        self._set_attributes(distributed_c10d, **compat.group_timeout_defaults(self.settings.timeout))
        self.group_backend = process_group_backend(device, self.settings.procs_per_gpu)
        if not self.owns_process_group:  # the caller set one up (a notebook, a job script): use it as it is
            if (dist.get_rank(), dist.get_world_size()) != (cluster.rank, cluster.world_size):
                raise UsageError(
                    f"the process group already initialised here is rank {dist.get_rank()} of "
                    f"{dist.get_world_size()}, but the launcher says {cluster.rank} of "
                    f"{cluster.world_size}; destroy it or launch to match"
                )
            self.group_backend = dist.get_backend()
        else:
            if self.group_backend == "ccl":
                importlib.import_module(ONECCL_MODULE)  # registers "ccl" with torch.distributed
            dist.init_process_group(
                self.group_backend,
                init_method="env://",
                rank=cluster.rank,
                world_size=cluster.world_size,
                timeout=timeout,
            )
            compat.process_group_created()
        self._meter_collectives(self.settings.metered)

    def _meter_collectives(self, metered: bool) -> None:
        """Every torch.distributed collective of the run (the framework's and the harness's) reports
        to self.collectives (harness.backends.collectives), until shutdown puts the functions back."""
        self.collective_functions: dict[str, Callable] = {}
        if not metered:
            return
        self.collective_functions, wait = torch_distributed_wrappers(self.collectives, dist)
        self._set_attributes(dist, **self.collective_functions)
        self._set_attributes(dist.Work, wait=wait)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def start_all_reduce_sum(self, tensor: torch.Tensor, name: str) -> Callable[[], torch.Tensor]:
        work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)

        def wait() -> torch.Tensor:
            work.wait()
            return tensor

        return wait

    def barrier(self) -> None:
        dist.barrier()

    @classmethod
    def is_peer_failure(cls, error: BaseException) -> bool:
        # NCCL and the rendezvous store raise DistError subclasses; gloo raises a plain RuntimeError
        # whose message comes from its TCP transport (a reset connection, or --timeout running out).
        return isinstance(error, dist.DistError) or (
            isinstance(error, RuntimeError) and any(marker in str(error) for marker in GLOO_FAILURE_MARKERS)
        )

    def shutdown(self) -> None:
        if getattr(self, "owns_process_group", False) and dist.is_initialized():
            dist.destroy_process_group()
        super().shutdown()
