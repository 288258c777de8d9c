"""Every workaround for a particular version of torch, DeepSpeed or Horovod, in one place.

Each entry says which versions it applies to and why it exists. An entry that reads a private
attribute checks that the attribute is there and otherwise raises a one-line UsageError naming
the versions that work, instead of failing somewhere inside a run. tests/unit/test_compat.py has one
test per entry that fails when its assumption about the installed versions stops holding.

Installed and tested together: torch 2.14 and 2.15, DeepSpeed 0.19.8, Horovod 0.28.1.
"""

from __future__ import annotations

import datetime
import importlib
import inspect
from collections.abc import Iterable
from typing import Any, Callable, Optional

import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel

from ..errors import UsageError, require

TORCH_VERSIONS = "torch 2.14 and 2.15"
DEEPSPEED_VERSIONS = "DeepSpeed 0.19"
DEEPSPEED_INSTALL = "pip install deepspeed (or run `make setup`)"
HOROVOD_VERSIONS = "Horovod 0.28.1"


def _missing(what: str, works_with: str) -> UsageError:
    return UsageError(
        f"{what} is missing from the installed version; the harness works with {works_with} "
        "(see harness/backends/compat.py)"
    )


# -- torch ------------------------------------------------------------------------------------


def ddp_without_buffer_sync() -> dict[str, bool]:
    """DistributedDataParallel's keyword that stops broadcasting buffers from rank 0 every step.

    Horovod and DeepSpeed do not broadcast buffers every step; the ddp backend does not either.
    torch 2.14 renamed the switch from `broadcast_buffers` to `forward_sync_buffers` (the initial
    broadcast it keeps is harmless: every rank starts equal); older versions have only the old name.
    """
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if "forward_sync_buffers" in parameters else {"broadcast_buffers": False}


# Process groups this process has created so far (the same count on every rank: runs are collective).
_groups_created = 0


def rendezvous_port(master_port: int) -> int:
    """The port of this process's next process group: the launcher's, then the ones above it.

    torch 2.14 and 2.15: a process group's TCP store outlives destroy_process_group once DDP has
    used the group (its server keeps listening: seen with `ss` after destroy, del and gc.collect).
    A second group on the same port in the same process then has some ranks connect to the stale
    store and wait forever. Every rank counts the groups it made (`process_group_created`), so a
    later run in the same processes (a notebook's engines) meets on the next port instead.
    """
    return master_port + _groups_created


def process_group_created() -> None:
    """Count a process group this process created (see rendezvous_port)."""
    global _groups_created
    _groups_created += 1


GROUP_TIMEOUT_DEFAULTS = ("default_pg_timeout", "default_pg_nccl_timeout")


def group_timeout_defaults(seconds: float) -> dict[str, datetime.timedelta]:
    """torch.distributed.distributed_c10d's module-level defaults, set to `seconds`, by name.

    Groups made without a timeout get these: 30 min (gloo) or 10 min (NCCL). DeepSpeed 0.19 makes
    its data-parallel groups so (deepspeed.comm new_group), and a hung peer stalled its gradient
    allreduce past --timeout; the backends make --timeout the default while they run. The two
    module globals are not public API (torch 2.14 and 2.15 have both).
    """
    missing = [name for name in GROUP_TIMEOUT_DEFAULTS if not hasattr(distributed_c10d, name)]
    if missing:
        raise _missing(f"torch.distributed.distributed_c10d.{missing[0]}", TORCH_VERSIONS)
    return {name: datetime.timedelta(seconds=seconds) for name in GROUP_TIMEOUT_DEFAULTS}


def process_groups() -> frozenset[Any]:
    """Every process group torch knows in this process, the world group included.

    torch keeps its registry private: `distributed_c10d._world.pg_map` (torch 1.13 to 2.15 at
    least). The deepspeed backend compares it before and after a run to release the groups
    DeepSpeed made (see destroy_deepspeed_groups).
    """
    registry = getattr(getattr(distributed_c10d, "_world", None), "pg_map", None)
    if registry is None:
        raise _missing(
            "torch.distributed.distributed_c10d._world.pg_map (torch's registry of process groups)", TORCH_VERSIONS
        )
    return frozenset(registry)


# -- DeepSpeed --------------------------------------------------------------------------------

DEEPSPEED_SHM_OP = "build_shm_op"


def no_shm_allreduce() -> None:
    """Stands in for deepspeed.comm.torch.build_shm_op: DeepSpeed then has no shared-memory op."""
    return None


def deepspeed_shm_op_stand_in() -> tuple[Any, dict[str, Callable[[], None]]]:
    """(deepspeed.comm.torch, {attribute: stand-in}) that starts DeepSpeed's comm layer without its
    CPU shared-memory allreduce op; no attribute where the installed DeepSpeed has no such op.

    On Linux CPUs DeepSpeed 0.19 JIT-compiles that op when its comm layer starts (about 45 s on a
    machine's first run) and, with every rank on one node, maps a 66 MB /dev/shm segment per rank
    that it never unlinks. The op serves only inference's allreduce, which training never calls,
    so the harness goes without it; the comm layer then uses torch.distributed for everything, as
    on other platforms. On GPUs DeepSpeed never builds it, so this changes nothing there.
    """
    # (deepspeed.comm's attribute `torch` is the torch package, so the module is looked up by name.)
    comm_torch = require("deepspeed.comm.torch", "DeepSpeed's communication layer", DEEPSPEED_INSTALL)
    return comm_torch, ({DEEPSPEED_SHM_OP: no_shm_allreduce} if hasattr(comm_torch, DEEPSPEED_SHM_OP) else {})


def weights_only_checkpoint_engine() -> Any:
    """DeepSpeed's torch checkpoint engine, loading with weights_only=True.

    DeepSpeed 0.19 loads its files with weights_only=False, which runs any pickled code. Its ZeRO
    files hold three of its own plain data classes besides tensors; those, and nothing else, are
    allowed. The classes are imported from DeepSpeed's internal modules.
    """
    import torch

    try:
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address
    except ImportError as exc:
        raise _missing(f"DeepSpeed's checkpoint class {exc.name or exc}", DEEPSPEED_VERSIONS) from None

    class WeightsOnlyCheckpointEngine(TorchCheckpointEngine):
        def load(self, path: str, map_location: Any = None) -> Any:
            with torch.serialization.safe_globals([LossScaler, ZeroStageEnum, fragment_address]):
                return torch.load(path, map_location=map_location, weights_only=True)

    return WeightsOnlyCheckpointEngine()


def deepspeed_grad_scaler(engine: Any, optimizer: Any) -> Optional[Any]:
    """The GradScaler DeepSpeed scales fp16 losses with under its `torch_autocast` section, or None.

    DeepSpeed 0.18 and newer keep it in an engine attribute (ZeRO-0) or an optimizer attribute
    (ZeRO 1-3), both undocumented; older versions have neither, and the deepspeed backend then
    refuses fp16 (check_loss_scaler) rather than scale otherwise than the other backends.
    """
    return getattr(engine, "torch_autocast_z0_gradscaler", None) or getattr(
        optimizer, "torch_autocast_gradscaler", None
    )


def clear_zero3_gradient_partitions(optimizer: Any) -> None:
    """Zero ZeRO-3's partitioned gradients after an optimizer step (DeepSpeed 0.19).

    Stage 3 reduces a parameter's gradient into its slice of one flat buffer,
    `grad_partitions_flat_buffer`, and steps every parameter with its slice
    (DeepSpeedZeroOptimizer_Stage3.independent_gradient_partition_epilogue), reduced this step or
    not; zero_grad clears only the parameters' own .grad. A parameter the loss did not reach in a
    step was stepped with the gradient of the last step that reached it (seen: a head skipped every
    third step ended 0.1 away from one process, momentum 0). Zeroed here, it is stepped with a zero
    gradient, as under every backend (harness.backends.base.UNUSED_PARAMETERS)."""
    flat = getattr(optimizer, "grad_partitions_flat_buffer", None)
    if flat is None:
        raise _missing("DeepSpeedZeroOptimizer_Stage3.grad_partitions_flat_buffer", DEEPSPEED_VERSIONS)
    flat.zero_()


def destroy_deepspeed_groups(groups: Iterable[Any]) -> None:
    """Destroy process groups DeepSpeed made during a run, and its references to them.

    DeepSpeed 0.19 clones the world group (and ZeRO makes groups of its own) and keeps them in
    module-level caches for the life of the process. A second run in the same process (a
    notebook's engines) would find the clone of a group destroyed since, and fail in
    deepspeed.initialize with "Group ... is not registered". deepspeed.comm.destroy_process_group
    releases DeepSpeed's references to the group it destroys; it needs DeepSpeed's comm backend
    (the undocumented global `cdb`), and plain torch destroys groups made before that existed.
    """
    comm = importlib.import_module("deepspeed.comm.comm")
    if not hasattr(comm, "cdb"):
        raise _missing("deepspeed.comm.comm.cdb (DeepSpeed's communication backend)", DEEPSPEED_VERSIONS)
    destroy = comm.destroy_process_group if comm.cdb is not None else dist.destroy_process_group
    for group in groups:
        destroy(group)


# -- Horovod ----------------------------------------------------------------------------------


def horovod_pending_handles(optimizer: Any) -> list[int]:
    """The handles of the gradient allreduces a Horovod DistributedOptimizer has started.

    Horovod 0.28.1 keeps them privately, as (handle, context) per parameter in `_handles`, and
    offers only `synchronize`, which spins on them (see HorovodBackend._wait for why the backend
    waits on each handle itself).
    """
    handles = getattr(optimizer, "_handles", None)
    if handles is None:
        raise _missing("Horovod DistributedOptimizer._handles", HOROVOD_VERSIONS)
    return [handle for handle, _ in handles.values() if handle is not None]
