"""Horovod: allreduce of gradients launched from backward hooks, tensor fusion, MPI or gloo."""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import nn

from ..cluster import MPI_LAUNCHERS, ClusterEnv
from ..config import TrainConfig
from ..errors import UsageError
from .base import Backend, OptimizerFactory

HOROVOD_LAUNCHERS = MPI_LAUNCHERS | {"horovodrun", "slurm", "none"}
# On CPU the ranks' compute threads fill the cores, and Horovod's background thread, which wakes
# every cycle to negotiate with the other ranks, takes its time from them: at 2 ranks x 1 thread on
# 2 cores, 5 ms instead of Horovod's 1 ms cut context switches 2.5x (benchmarks/throughput.py).
CPU_CYCLE_TIME_MS = 5.0
HOROVOD_DEFAULT_CYCLE_TIME_MS = 1.0
HOROVOD_DEFAULT_FUSION_MB = 128.0
POLL_INTERVAL_S = 0.0002


def _setting(flag: Optional[float], variable: str, variable_units_per_unit: float, default: float) -> float:
    """A knob's value: the flag, else the environment variable (in Horovod's units), else `default`."""
    if flag is not None:
        return flag
    value = os.environ.get(variable)
    if not value:
        return default
    try:
        return float(value) / variable_units_per_unit
    except ValueError:
        raise UsageError(f"{variable}={value!r} is not a number; fix or unset it") from None


class HorovodBackend(Backend):
    """hvd.DistributedOptimizer with explicit averaging; parameters broadcast from rank 0."""

    name = "horovod"
    local_launcher = "horovodrun"
    library = "horovod"
    install_hint = "run `make setup` (builds Horovod 0.28.1 against this torch) or load your site's module"

    def check_available(self) -> None:
        super().check_available()
        try:
            import horovod.torch  # noqa: F401  (fails if built for another torch or without PyTorch)
        except (ImportError, OSError) as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"horovod.torch cannot be loaded ({first_line}); rebuild it against this torch "
                             "with `make setup` (tools/build_horovod.sh)") from exc

    def check_launch(self, config: TrainConfig, cluster: ClusterEnv) -> None:
        if cluster.launcher not in HOROVOD_LAUNCHERS:
            raise UsageError(f"Horovod cannot join a job started by {cluster.launcher}; launch it with horovodrun, "
                             "mpirun/mpiexec or srun (e.g. `harness launch --backend horovod`)")

    def init(self, cluster: ClusterEnv, device: torch.device, config: TrainConfig) -> None:
        # Knobs are environment variables read by hvd.init(): a flag wins, then the user's variable,
        # then the default. Only values other than Horovod's own are exported, so that
        # HOROVOD_AUTOTUNE still tunes the ones nobody chose.
        self.fusion_threshold_mb = _setting(config.hvd_fusion_threshold_mb, "HOROVOD_FUSION_THRESHOLD", 2**20,
                                            HOROVOD_DEFAULT_FUSION_MB)
        self.cycle_time_ms = _setting(config.hvd_cycle_time_ms, "HOROVOD_CYCLE_TIME", 1,
                                      CPU_CYCLE_TIME_MS if device.type == "cpu" else HOROVOD_DEFAULT_CYCLE_TIME_MS)
        if self.fusion_threshold_mb != HOROVOD_DEFAULT_FUSION_MB:
            os.environ["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_threshold_mb * 2**20))
        if self.cycle_time_ms != HOROVOD_DEFAULT_CYCLE_TIME_MS:
            os.environ["HOROVOD_CYCLE_TIME"] = str(self.cycle_time_ms)
        # Bound gloo's waits so a dead peer fails the job (MPI jobs are ended by mpirun itself).
        # Set, not defaulted: horovodrun exports its own --gloo-timeout-seconds, and a hung peer then
        # stalled the job for that long whatever --timeout said.
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(max(1, round(config.timeout)))
        import horovod.torch as hvd

        hvd.init()
        if (hvd.rank(), hvd.size()) != (cluster.rank, cluster.world_size):
            raise UsageError(f"Horovod sees rank {hvd.rank()} of {hvd.size()} but the launcher says "
                             f"{cluster.rank} of {cluster.world_size}; launch with one launcher only")
        self.hvd = hvd

    def wrap(self, model: nn.Module, make_optimizer: OptimizerFactory, config: TrainConfig,
             local_batch: int) -> Tuple[nn.Module, torch.optim.Optimizer]:
        hvd = self.hvd
        self.grad_clip = config.grad_clip
        self.model = model
        optimizer = make_optimizer(model.parameters())
        # Start every rank from rank 0's weights and optimizer state.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self.compression_fp16 = config.hvd_fp16_compression
        compression = hvd.Compression.fp16 if config.hvd_fp16_compression else hvd.Compression.none
        self.optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                                  compression=compression, op=hvd.Average,
                                                  backward_passes_per_step=1)
        self.gradients_synced = False
        return self.model, self.optimizer

    def _wait(self, handle: int) -> None:
        # hvd.synchronize spins (yield in a loop, dropping and retaking the GIL) until the handle is
        # done, taking a core from the background thread and gloo that must finish the allreduce,
        # and from the other ranks' compute when ranks fill the cores. Sleeping between polls costs
        # at most POLL_INTERVAL_S of latency; synchronize then finds the handle done.
        while not self.hvd.poll(handle):
            time.sleep(POLL_INTERVAL_S)

    def finish_gradient_sync(self) -> None:
        # backward only *starts* Horovod's allreduces (from gradient hooks); wait for them here so
        # the loop's gradient phase includes them, as it does for DDP and DeepSpeed.
        for handle, _ in self.optimizer._handles.values():  # Horovod keeps (handle, context) per parameter
            if handle is not None:
                self._wait(handle)
        self.optimizer.synchronize()
        self.gradients_synced = True

    def step(self) -> None:
        if not self.gradients_synced:
            self.finish_gradient_sync()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)  # the averaged gradients
        # synchronize() again would allreduce the already averaged gradients a second time.
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        self.gradients_synced = False
        self.optimizer.zero_grad()  # Horovod's takes no arguments; torch's default sets gradients to None

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.start_all_reduce_sum(tensor, name=None)()

    def start_all_reduce_sum(self, tensor: torch.Tensor, name: Optional[str]) -> Callable[[], torch.Tensor]:
        # A fixed name hits Horovod's response cache; a fresh one would cost a negotiation round.
        handle = self.hvd.allreduce_async(tensor, op=self.hvd.Sum, name=name)

        def wait() -> torch.Tensor:
            self._wait(handle)
            return self.hvd.synchronize(handle)
        return wait

    def barrier(self) -> None:
        self.hvd.barrier()

    def is_peer_failure(self, error: BaseException) -> bool:
        # When a peer's gloo or MPI connection fails (or HOROVOD_GLOO_TIMEOUT_SECONDS runs out),
        # Horovod shuts down and every pending and later operation raises HorovodInternalError.
        from horovod.common.exceptions import HorovodInternalError

        return isinstance(error, HorovodInternalError)

    def math_settings(self, config: TrainConfig) -> Dict[str, Any]:
        settings = super().math_settings(config)
        if config.hvd_fp16_compression:
            settings["gradient_compression"] = "fp16"
        return settings

    def tuning(self) -> Dict[str, Any]:
        return {"fusion_threshold_mb": self.fusion_threshold_mb, "cycle_time_ms": self.cycle_time_ms,
                "fp16_compression": self.compression_fp16}

    def versions(self) -> Dict[str, str]:
        import horovod

        return {"horovod": horovod.__version__}

    def shutdown(self) -> None:
        if hasattr(self, "hvd"):
            self.hvd.shutdown()
