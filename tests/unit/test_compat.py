"""One test per entry of harness/backends/compat.py: each fails when the assumption behind its
workaround stops holding in the installed torch, DeepSpeed or Horovod (a private attribute gone,
a renamed parameter, or a workaround no longer needed), and each guard names the versions that work."""

from __future__ import annotations

import datetime
import importlib
import inspect
import socket
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.nn.parallel import DistributedDataParallel

from harness.backends import compat
from harness.errors import UsageError
from harness.process.launchers import free_port


@pytest.fixture
def one_rank_group() -> Iterator[int]:
    """A 1-rank gloo process group in this process, on a port of its own; yields the port."""
    port = free_port()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
    )
    try:
        yield port
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _listening(port: int) -> bool:
    with socket.socket() as client:
        return client.connect_ex(("127.0.0.1", port)) == 0


def _assert_names_the_versions(error: pytest.ExceptionInfo, versions: str) -> None:
    message = str(error.value)
    assert "\n" not in message and f"the harness works with {versions}" in message, message


def test_ddp_takes_the_buffer_sync_switch_compat_names():
    ((name, value),) = compat.ddp_without_buffer_sync().items()
    assert name in inspect.signature(DistributedDataParallel.__init__).parameters and value is False


def test_torch_has_the_group_timeout_defaults_compat_sets(monkeypatch):
    defaults = compat.group_timeout_defaults(7)
    assert defaults == {name: datetime.timedelta(seconds=7) for name in compat.GROUP_TIMEOUT_DEFAULTS}
    assert all(isinstance(getattr(distributed_c10d, name), datetime.timedelta) for name in defaults)
    monkeypatch.delattr(distributed_c10d, "default_pg_nccl_timeout")
    with pytest.raises(UsageError) as error:
        compat.group_timeout_defaults(7)
    _assert_names_the_versions(error, compat.TORCH_VERSIONS)


def test_torchs_private_registry_lists_the_process_groups(one_rank_group, monkeypatch):
    before = compat.process_groups()
    assert dist.group.WORLD in before
    made = dist.new_group([0])
    assert compat.process_groups() - before == {made}
    with monkeypatch.context() as patched, pytest.raises(UsageError) as error:
        patched.delattr(distributed_c10d, "_world")
        compat.process_groups()
    _assert_names_the_versions(error, compat.TORCH_VERSIONS)


def test_deepspeed_still_builds_its_shared_memory_op_when_its_comm_layer_starts():
    comm_torch, stand_ins = compat.deepspeed_shm_op_stand_in()
    assert stand_ins == {compat.DEEPSPEED_SHM_OP: compat.no_shm_allreduce}, "no shm op: the stand-in may be dropped"
    assert "ShareMemCommBuilder" in inspect.getsource(getattr(comm_torch, compat.DEEPSPEED_SHM_OP))
    assert compat.no_shm_allreduce() is None


def test_deepspeed_still_loads_checkpoints_unsafely_and_the_engine_loads_its_own_classes_safely(tmp_path):
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    from deepspeed.runtime.zero.config import ZeroStageEnum

    assert "weights_only=False" in inspect.getsource(TorchCheckpointEngine.load), "compat's engine may be dropped"
    engine = compat.weights_only_checkpoint_engine()
    path = str(tmp_path / "state.pt")
    torch.save({"stage": ZeroStageEnum.gradients, "weights": torch.ones(2)}, path)
    assert engine.load(path)["stage"] == ZeroStageEnum.gradients
    torch.save({"not_allowed": datetime.date(2020, 1, 1)}, path)
    with pytest.raises(Exception, match="weights_only"):
        engine.load(path)


def test_deepspeed_keeps_its_fp16_grad_scalers_where_compat_reads_them():
    engine_source = inspect.getsource(importlib.import_module("deepspeed.runtime.engine"))
    optimizer_source = inspect.getsource(importlib.import_module("deepspeed.runtime.base_optimizer"))
    assert "self.torch_autocast_z0_gradscaler =" in engine_source
    assert "torch_autocast_gradscaler" in optimizer_source
    scaler = torch.amp.GradScaler("cpu")
    assert compat.deepspeed_grad_scaler(type("Engine", (), {"torch_autocast_z0_gradscaler": scaler})(), None) is scaler
    assert compat.deepspeed_grad_scaler(object(), object()) is None


def test_deepspeed_comm_releases_the_groups_it_destroys(monkeypatch):
    comm = importlib.import_module("deepspeed.comm.comm")
    assert hasattr(comm, "cdb")
    assert "_release_process_group_references" in inspect.getsource(comm.destroy_process_group)
    monkeypatch.delattr(comm, "cdb")
    with pytest.raises(UsageError) as error:
        compat.destroy_deepspeed_groups([])
    _assert_names_the_versions(error, compat.DEEPSPEED_VERSIONS)


def test_horovods_optimizer_keeps_its_allreduce_handles_where_compat_reads_them():
    optimizer = importlib.import_module("horovod.torch.optimizer")
    source = inspect.getsource(optimizer._DistributedOptimizer)
    assert "self._handles = {}" in source and "self._handles[p] = (handle, ctx)" in source
    started = type("Optimizer", (), {"_handles": {"a": (3, None), "b": (None, None)}})()
    assert compat.horovod_pending_handles(started) == [3]
    with pytest.raises(UsageError) as error:
        compat.horovod_pending_handles(object())
    _assert_names_the_versions(error, compat.HOROVOD_VERSIONS)
