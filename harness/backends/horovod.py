"""Horovod: allreduce of gradients launched from backward hooks, tensor fusion, MPI or gloo."""

from __future__ import annotations

import os
import sys
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..errors import UsageError, require
from ..options import BaseOptions, option
from ..process.discovery import ClusterEnv
from ..process.launchers import MPI_FAMILIES, families
from . import compat
from .base import Backend, OptimizerFactory
from .collectives import InFlight, nbytes
from .scripts import ScriptHooks, recording
from .traffic import Collective, ModelShape, in_buckets

# Ranks Horovod can join: those MPI, horovodrun or srun started, and a plain process; Horovod does
# not read the variables of torchrun and the deepspeed launcher.
HOROVOD_LAUNCHERS = MPI_FAMILIES | families("horovodrun", "srun", "python")
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


def _whole_seconds(seconds: float) -> str:
    """HOROVOD_GLOO_TIMEOUT_SECONDS's value for `seconds`: whole seconds, at least 1."""
    return str(max(1, round(seconds)))


class HorovodScriptHooks(ScriptHooks):
    """A script's Horovod collectives bounded in time; its DistributedOptimizer tells each gradient
    allreduce it starts."""

    @classmethod
    def limit_collective_waits(cls, seconds: float) -> None:
        # hvd.init() reads it; horovodrun's own --gloo-timeout-seconds would otherwise stand. Set for
        # good, not patched: it is for the whole process of a script that runs Horovod itself.
        os.environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] = _whole_seconds(seconds)

    @classmethod
    def watch_gradient_syncs(cls, record: Callable[[], None]) -> None:
        # hvd.DistributedOptimizer starts a gradient's allreduce from the hook of its accumulator
        # once backward_passes_per_step backward passes have added to it (a group of gradients: the
        # group's, once), and in step() for a gradient no hook started. Its optimizer class is built
        # from a copy of _DistributedOptimizer's attributes when the script calls it: these stand-ins,
        # set first, are in that copy.
        from horovod.torch.optimizer import _DistributedOptimizer

        for name in ("_allreduce_grad_async", "_grouped_allreduce_grad_async"):
            setattr(_DistributedOptimizer, name, recording(getattr(_DistributedOptimizer, name), record))


class HorovodBackend(Backend):
    """hvd.DistributedOptimizer with explicit averaging; parameters broadcast from rank 0."""

    name = "horovod"
    local_launcher = "horovodrun"
    # Horovod's background thread negotiates with the other ranks every cycle and runs the fused
    # collectives (see HOROVOD_DEFAULT_CYCLE_TIME_MS above).
    helper_threads = ("1 background thread (Horovod's)",)
    local_launchers = ("horovodrun", "mpirun")  # HOROVOD_LAUNCHERS on one machine
    library = "horovod"
    script_hooks = HorovodScriptHooks
    install_hint = "run `make setup` (builds Horovod 0.28.1 against this torch) or load your site's module"
    # Horovod refuses non-contiguous tensors ("Tensor is required to be contiguous") in its
    # broadcast and in the gradient allreduce, and a channels-last weight's gradient is one.
    channels_last_weights = False
    # Horovod 0.28 builds for CUDA and ROCm GPUs (HOROVOD_GPU=CUDA or ROCM) and CPUs; it has no XPU
    # operations. --compile: Horovod averages from hooks on the parameters' gradient accumulators,
    # which the compiled backward still runs, so the plain module is compiled (Backend.compile).
    devices = ("cuda", "rocm", "cpu")

    @dataclass(frozen=True)
    class Options(BaseOptions):
        """Horovod's knobs: tensor fusion and the background thread's cycle change speed only;
        fp16 compression changes the math (compressed gradients train other weights)."""

        fusion_threshold_mb: Optional[float] = option(
            None,
            "--hvd-fusion-threshold-mb",
            "horovod: tensor-fusion buffer in MB (default: Horovod's, 128)",
            type=float,
        )
        fp16_compression: bool = option(
            False,
            "--hvd-fp16-compression",
            "horovod: send gradients as fp16 (changes the math)",
            resume_must_match=True,
        )
        cycle_time_ms: Optional[float] = option(
            None,
            "--hvd-cycle-time-ms",
            "horovod: background-thread cycle in ms (default: $HOROVOD_CYCLE_TIME, else 5 on CPU, Horovod's 1 on GPU)",
            type=float,
        )

        def validate(self) -> None:
            for name in ("fusion_threshold_mb", "cycle_time_ms"):
                value = getattr(self, name)
                if value is not None and not value > 0:
                    raise UsageError(f"{self.flag(name)} must be positive, got {value}")

    options: Options

    def check_available(self) -> None:
        super().check_available()
        # Fails if Horovod was built for another torch or without PyTorch.
        require(
            "horovod.torch",
            f"backend {self.name!r}",
            "rebuild it against this torch with `make setup` (tools/build_horovod.sh)",
        )

    def build_info(self) -> dict[str, bool]:
        import horovod.torch as hvd

        return {
            "mpi": bool(hvd.mpi_built()),
            "gloo": bool(hvd.gloo_built()),
            "nccl": bool(hvd.nccl_built()),
            "cuda": bool(hvd.cuda_built()),
        }

    def check_launch(self, cluster: ClusterEnv, device: torch.device) -> None:
        if cluster.launcher not in HOROVOD_LAUNCHERS:
            raise UsageError(
                f"Horovod cannot join a job started by {cluster.launcher}; launch it with horovodrun, "
                "mpirun/mpiexec or srun (e.g. `harness launch --backend horovod`)"
            )
        import horovod.torch as hvd

        if device.type == "cuda" and self.settings.procs_per_gpu > 1 and hvd.nccl_built():
            raise UsageError(
                "this Horovod reduces GPU tensors with NCCL, which refuses two ranks on one GPU; "
                "for --procs-per-gpu > 1 use --backend ddp or deepspeed (gloo), or a Horovod built "
                "without HOROVOD_GPU_OPERATIONS=NCCL (it reduces through MPI)"
            )

    def init(self, cluster: ClusterEnv, device: torch.device) -> None:
        # Knobs are environment variables read by hvd.init(): a flag wins, then the user's variable,
        # then the default. Only values other than Horovod's own are exported, so that
        # HOROVOD_AUTOTUNE still tunes the ones nobody chose. Shutdown restores the variables, so
        # one run's values never become the next run's "user's variable".
        self.fusion_threshold_mb = _setting(
            self.options.fusion_threshold_mb, "HOROVOD_FUSION_THRESHOLD", 2**20, HOROVOD_DEFAULT_FUSION_MB
        )
        self.cycle_time_ms = _setting(
            self.options.cycle_time_ms,
            "HOROVOD_CYCLE_TIME",
            1,
            CPU_CYCLE_TIME_MS if device.type == "cpu" else HOROVOD_DEFAULT_CYCLE_TIME_MS,
        )
        if self.fusion_threshold_mb != HOROVOD_DEFAULT_FUSION_MB:
            self._set_environ(HOROVOD_FUSION_THRESHOLD=str(int(self.fusion_threshold_mb * 2**20)))
        if self.cycle_time_ms != HOROVOD_DEFAULT_CYCLE_TIME_MS:
            self._set_environ(HOROVOD_CYCLE_TIME=str(self.cycle_time_ms))
        # Bound gloo's waits so a dead peer fails the job (MPI jobs are ended by mpirun itself).
        # Set, not defaulted: horovodrun exports its own --gloo-timeout-seconds, and a hung peer then
        # stalled the job for that long whatever --timeout said.
        self._set_environ(HOROVOD_GLOO_TIMEOUT_SECONDS=_whole_seconds(self.settings.timeout))
        if cluster.launcher in MPI_FAMILIES:
            # MPI initialised by mpi4py outlives Horovod: Horovod finalises only an MPI it started
            # itself, and a finalised MPI cannot start again, so a later run in this process could
            # not init Horovod (a notebook's engines run several).
            require("mpi4py.MPI", "Horovod under an MPI launcher", "pip install mpi4py (make setup installs it)")
        import horovod.torch as hvd

        self.hvd = hvd
        self._in_flight: dict[int, InFlight] = {}  # handle -> its collective (harness.backends.collectives)
        self.metered = self.settings.metered
        self.owns_horovod = not hvd.is_initialized()
        if self.owns_horovod:
            hvd.init()
        if (hvd.rank(), hvd.size()) != (cluster.rank, cluster.world_size):
            raise UsageError(
                f"Horovod sees rank {hvd.rank()} of {hvd.size()} but the launcher says "
                f"{cluster.rank} of {cluster.world_size}; launch with one launcher only"
            )

    def wrap(
        self, model: nn.Module, make_optimizer: OptimizerFactory, local_batch: int
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        hvd = self.hvd
        self.model = model
        optimizer = make_optimizer(model.parameters())
        # Start every rank from rank 0's weights and optimizer state.
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if self.metered:
            self._meter_gradient_allreduces()
        compression = hvd.Compression.fp16 if self.options.fp16_compression else hvd.Compression.none
        # Gradient accumulation: the hooks count backward passes and allreduce on the last one.
        self.optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            compression=compression,
            op=hvd.Average,
            backward_passes_per_step=self.settings.grad_accum,
        )
        self._local_setup()
        self.gradients_synced = False
        return self.model, self.optimizer

    def _meter_gradient_allreduces(self) -> None:
        """The DistributedOptimizer's allreduces (one handle per gradient, or per group; Horovod fuses
        them into fewer operations on the wire) report to self.collectives: its module's functions
        wrapped for the run, put back at shutdown."""
        from horovod.torch import optimizer as hvd_optimizer

        def metered(function: Callable) -> Callable:
            def allreduce(tensor: Any, *args: Any, **kwargs: Any) -> int:
                issued = self.collectives.clock()
                handle = function(tensor, *args, **kwargs)
                self._in_flight[handle] = self.collectives.issued("all_reduce", nbytes(tensor), at=issued)
                return handle

            return allreduce

        names = ("allreduce_async_", "grouped_allreduce_async_")
        self._set_attributes(hvd_optimizer, **{name: metered(getattr(hvd_optimizer, name)) for name in names})

    def _wait(self, handle: int) -> None:
        one = self._in_flight.pop(handle, None)
        if one is not None and self.hvd.poll(handle):
            self.collectives.completed(one)  # done while the rank computed (first seen now: an upper bound)
        elif one is not None:
            with self.collectives.waiting(one):
                self._poll(handle)
        else:
            self._poll(handle)

    def _poll(self, handle: int) -> None:
        # hvd.synchronize spins (yield in a loop, dropping and retaking the GIL) until the handle is
        # done, taking a core from the background thread and gloo that must finish the allreduce,
        # and from the other ranks' compute when ranks fill the cores. Sleeping between polls costs
        # at most POLL_INTERVAL_S of latency; synchronize then finds the handle done.
        while not self.hvd.poll(handle):
            time.sleep(POLL_INTERVAL_S)

    def finish_gradient_sync(self) -> None:
        # backward only *starts* Horovod's allreduces (from gradient hooks); wait for them here so
        # the loop's gradient phase includes them, as it does for DDP and DeepSpeed.
        for handle in compat.horovod_pending_handles(self.optimizer):
            self._wait(handle)
        self.optimizer.synchronize()
        self.gradients_synced = True

    def step(self) -> None:
        if not self.gradients_synced:
            self.finish_gradient_sync()
        super().step()  # unscale (fp16) and clip the averaged gradients, then step
        self.gradients_synced = False

    def _applying_gradients(self) -> AbstractContextManager:
        # synchronize() again would allreduce the already averaged gradients a second time.
        return self.optimizer.skip_synchronize()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.start_all_reduce_sum(tensor, name=None)()

    def start_all_reduce_sum(self, tensor: torch.Tensor, name: Optional[str]) -> Callable[[], torch.Tensor]:
        # A fixed name hits Horovod's response cache; a fresh one would cost a negotiation round.
        issued = self.collectives.clock()
        handle = self.hvd.allreduce_async(tensor, op=self.hvd.Sum, name=name)
        if self.metered:
            self._in_flight[handle] = self.collectives.issued("all_reduce", nbytes(tensor), at=issued)

        def wait() -> torch.Tensor:
            self._wait(handle)
            return self.hvd.synchronize(handle)

        return wait

    def barrier(self) -> None:
        self.hvd.barrier()

    @classmethod
    def is_peer_failure(cls, error: BaseException) -> bool:
        # When a peer's gloo or MPI connection fails (or HOROVOD_GLOO_TIMEOUT_SECONDS runs out),
        # Horovod shuts down and every pending and later operation raises HorovodInternalError.
        # Looked up, not imported: an error raised before Horovod was loaded is not Horovod's.
        exceptions = sys.modules.get("horovod.common.exceptions")
        return exceptions is not None and isinstance(error, exceptions.HorovodInternalError)

    def math_settings(self) -> dict[str, Any]:
        settings = super().math_settings()
        if self.options.fp16_compression:
            settings["gradient_compression"] = "fp16"
        return settings

    def traffic(self, shape: ModelShape, on_gpu: bool = True) -> list[Collective]:
        # The background thread fuses the gradients ready in one cycle into buffers of at most the
        # fusion threshold; a cycle (1 ms on GPU) is shorter than a backward, so the threshold is
        # an upper bound on a call's size. fp16 compression halves the bytes sent.
        fusion = self.options.fusion_threshold_mb or HOROVOD_DEFAULT_FUSION_MB
        share = 2 if self.options.fp16_compression else 1
        sizes = [size // share for size in shape.modules()[::-1]]
        return in_buckets("all_reduce", sizes, int(fusion * 2**20), "backward_reduce", overlapped=True)

    def tuning(self) -> dict[str, Any]:
        return {
            "fusion_threshold_mb": self.fusion_threshold_mb,
            "cycle_time_ms": self.cycle_time_ms,
            "fp16_compression": self.options.fp16_compression,
        }

    def versions(self) -> dict[str, str]:
        import horovod

        return {"horovod": horovod.__version__}

    def shutdown(self) -> None:
        if getattr(self, "owns_horovod", False):
            self.hvd.shutdown()
        super().shutdown()
