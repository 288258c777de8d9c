"""torch.distributed plumbing shared by the DDP and DeepSpeed backends."""

from __future__ import annotations

import datetime
import os
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from ..cluster import ClusterEnv
from ..config import TrainConfig
from .base import Backend

# Substrings of the errors gloo raises when a peer is gone: "Connection closed by peer", "Read error
# ...: Connection reset by peer", "Timed out waiting 20000ms for recv operation to complete", and
# "Application timeout caused pair closure" (a later collective on a connection that timed out).
GLOO_FAILURE_MARKERS = ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "Timed out waiting",
                        "Application timeout caused pair closure")


class TorchDistributedBackend(Backend):
    """A backend whose ranks talk through a torch.distributed process group (gloo or NCCL)."""

    local_launcher = "torchrun"

    def check_launch(self, config: TrainConfig, cluster: ClusterEnv) -> None:
        """Any launcher works: rank and size come from harness.cluster."""

    def init(self, cluster: ClusterEnv, device: torch.device, config: TrainConfig) -> None:
        # Export the discovered values under torchrun's names: libraries (DeepSpeed among them)
        # read these, whichever launcher actually started the process.
        os.environ.update(RANK=str(cluster.rank), WORLD_SIZE=str(cluster.world_size),
                          LOCAL_RANK=str(cluster.local_rank), LOCAL_WORLD_SIZE=str(cluster.local_world_size),
                          MASTER_ADDR=cluster.master_addr, MASTER_PORT=str(cluster.master_port))
        # The timeout bounds every collective: a dead peer fails the job instead of hanging it.
        timeout = datetime.timedelta(seconds=config.timeout)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                                rank=cluster.rank, world_size=cluster.world_size, timeout=timeout)
        # Groups made later without a timeout get torch's default, 30 min (gloo) or 10 min (NCCL):
        # DeepSpeed builds its data-parallel groups so (deepspeed.comm new_group), and a hung peer
        # stalled its gradient allreduce past --timeout. Make --timeout the default for them too.
        distributed_c10d.default_pg_timeout = distributed_c10d.default_pg_nccl_timeout = timeout

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

    def is_peer_failure(self, error: BaseException) -> bool:
        # NCCL and the rendezvous store raise DistError subclasses; gloo raises a plain RuntimeError
        # whose message comes from its TCP transport (a reset connection, or --timeout running out).
        return isinstance(error, dist.DistError) or (
            isinstance(error, RuntimeError) and any(marker in str(error) for marker in GLOO_FAILURE_MARKERS))

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
