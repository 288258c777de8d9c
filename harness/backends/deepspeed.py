"""DeepSpeed: the engine owns model and optimizer; ZeRO stages 0-3."""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..errors import UsageError, first_line
from ..options import BaseOptions, option
from ..process.discovery import ClusterEnv
from . import compat
from .base import BackendSettings, OptimizerFactory, zero_missing_gradients
from .precision import LOSS_SCALE, Precision
from .torch_distributed import TorchDistributedBackend, TorchDistributedScriptHooks
from .traffic import Collective, ModelShape, evenly

NO_PRINT = 1 << 30
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000  # reduce_bucket_size and allgather_bucket_size by default
DEEPSPEED_SUB_GROUP_ELEMENTS = 1_000_000_000  # ZeRO-3's sub_group_size by default
FLOAT32_BYTES = 4  # the harness trains float32 weights (autocast for bf16/fp16): ZeRO buckets hold float32
# ZeRO-3 frees a gathered weight only when it will not be reused within stage3_max_reuse_distance
# elements, or when more than stage3_max_live_parameters are gathered; both default to 1e9
# (deepspeed/runtime/zero/config.py). Below that size a model's weights, gathered in forward, stay
# for its backward: a 2-rank run of the workshop CNN gathers each weight once a step.
# --zero-gathered-mb sets both, and stage3_prefetch_bucket_size, to its size.
ZERO3_KEEP_GATHERED_ELEMENTS = 1_000_000_000
ZERO3_PERSISTENCE_ELEMENTS = 100_000  # stage3_param_persistence_threshold: smaller modules stay whole
# DeepSpeed's names for the autocast dtypes of --precision.
AUTOCAST_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _float32_elements(mib: Optional[float], default: int) -> int:
    return default if mib is None else int(mib * 2**20) // FLOAT32_BYTES


def zero_bucket_elements(options: DeepSpeedBackend.Options) -> int:
    """reduce_bucket_size and allgather_bucket_size: --zero-bucket-mb in float32 elements, else DeepSpeed's."""
    return _float32_elements(options.zero_bucket_mb, DEEPSPEED_BUCKET_ELEMENTS)


def zero_sub_group_elements(options: DeepSpeedBackend.Options) -> int:
    """ZeRO-3's sub_group_size: the float32 elements of this rank's slice the optimizer steps at once
    (DeepSpeed copies their gradients into one tensor first, and Adam makes two more of that size)."""
    return _float32_elements(options.zero_sub_group_mb, DEEPSPEED_SUB_GROUP_ELEMENTS)


def zero_gathered_elements(options: DeepSpeedBackend.Options) -> int:
    """The float32 elements of weights ZeRO-3 keeps gathered (stage3_max_live_parameters) and keeps
    for reuse (stage3_max_reuse_distance): --zero-gathered-mb, else DeepSpeed's 1e9."""
    return _float32_elements(options.zero_gathered_mb, ZERO3_KEEP_GATHERED_ELEMENTS)


def zero_gathered_modules(shape: ModelShape) -> list[int]:
    """The float32 bytes of the modules ZeRO-3 gathers, in forward order: those above its persistence
    threshold (shape.modules() tells modules, not tensors: a rule of thumb for the threshold)."""
    return [size for size in shape.modules() if size > ZERO3_PERSISTENCE_ELEMENTS * FLOAT32_BYTES]


def zero_regathered_modules(shape: ModelShape, options: DeepSpeedBackend.Options) -> list[int]:
    """The modules ZeRO-3 gathers again for their backward, in backward order: a module's weights
    are freed after its forward when the weights gathered before its backward (the modules after
    it, in forward and again in backward) pass stage3_max_reuse_distance. Measured at 2 ranks on
    the transformer of width 1024 under --zero-gathered-mb 4: all but its last two modules."""
    gathered, limit = zero_gathered_modules(shape), zero_gathered_elements(options) * FLOAT32_BYTES
    return [size for i, size in enumerate(gathered) if 2 * sum(gathered[i + 1 :]) > limit][::-1]


def deepspeed_config(
    settings: BackendSettings, options: DeepSpeedBackend.Options, local_batch: int, world_size: int
) -> dict[str, Any]:
    """The DeepSpeed config the harness passes, with every math-changing default set explicitly."""
    precision = Precision.of(settings.precision)
    buckets = {}
    if options.zero_bucket_mb is not None:  # else DeepSpeed's defaults: 5e8 elements each
        elements = zero_bucket_elements(options)
        buckets = {"reduce_bucket_size": elements, "allgather_bucket_size": elements}
    if options.zero_sub_group_mb is not None:
        buckets["sub_group_size"] = zero_sub_group_elements(options)
    if options.zero_gathered_mb is not None:  # else 1e9, 1e9 and 5e7 elements: a large model's weights stay
        elements = zero_gathered_elements(options)
        buckets |= {
            "stage3_max_live_parameters": elements,
            "stage3_max_reuse_distance": elements,
            "stage3_prefetch_bucket_size": elements,
        }
    return {
        # DeepSpeed's batch is global; the harness's --batch-size is per worker and micro-batch.
        "train_micro_batch_size_per_gpu": local_batch // settings.grad_accum,
        "gradient_accumulation_steps": settings.grad_accum,
        "train_batch_size": local_batch * world_size,
        # DeepSpeed clips at norm 1.0 unless told otherwise; DDP and Horovod do not clip.
        "gradient_clipping": settings.grad_clip,
        "prescale_gradients": False,
        "gradient_predivide_factor": 1.0,
        # Its own fp16/bf16 modes keep half-precision weights: other math than autocast's.
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        # torch.autocast with float32 weights, as the other backends run it. An empty list of
        # "lower precision safe modules" keeps gradients in float32 when they are averaged
        # (DeepSpeed would otherwise send Linear and Conv gradients in the autocast dtype).
        **(
            {
                "torch_autocast": {
                    "enabled": True,
                    "dtype": AUTOCAST_DTYPES[precision.autocast_dtype],
                    "lower_precision_safe_modules": [],
                }
            }
            if precision.autocast_dtype
            else {}
        ),
        "zero_optimization": {"stage": options.zero_stage, **buckets},
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


def check_loss_scaler(scaler: Optional[torch.amp.GradScaler]) -> None:
    """Fail loudly if DeepSpeed's fp16 loss scaler is missing or scales otherwise than the harness's."""
    if scaler is None:
        raise UsageError(
            "this DeepSpeed has no torch_autocast loss scaler for --precision fp16; "
            "use --precision bf16, or DeepSpeed 0.18 or newer"
        )
    settings = {
        "init_scale": scaler.get_scale(),
        "growth_factor": scaler.get_growth_factor(),
        "backoff_factor": scaler.get_backoff_factor(),
        "growth_interval": scaler.get_growth_interval(),
    }
    if settings != LOSS_SCALE:
        raise UsageError(
            f"DeepSpeed's fp16 loss scaler uses {settings}, the other backends {LOSS_SCALE}; "
            "the frameworks would not compare fairly: use --precision bf16 or fp32"
        )


class DeepSpeedScriptHooks(TorchDistributedScriptHooks):
    """A script's DeepSpeed: its init timeout bounded, the config of every engine it builds told, and
    each gradient averaging its engines do at a gradient accumulation boundary."""

    @classmethod
    def limit_collective_waits(cls, seconds: float) -> None:
        super().limit_collective_waits(seconds)
        # deepspeed.init_distributed's timeout, read when deepspeed is imported: whole minutes (default 10).
        # Set for good, not patched: it is for the whole process of a script that runs DeepSpeed itself.
        os.environ["DEEPSPEED_TIMEOUT"] = str(max(1, round(seconds / 60)))

    @classmethod
    def watch_engine_config(cls, record: Callable[[Any], None]) -> None:
        # The config as deepspeed.initialize takes it: a dict or a JSON file's path, by keyword or
        # in args.deepspeed_config. Scripts look deepspeed.initialize up when they call it.
        import deepspeed

        initialize = deepspeed.initialize

        def watched(*args: Any, **kwargs: Any) -> Any:
            given = kwargs.get("config") or kwargs.get("config_params")
            if given is None:
                given = getattr(kwargs.get("args", args[0] if args else None), "deepspeed_config", None)
            record(given)
            return initialize(*args, **kwargs)

        deepspeed.initialize = watched

    @classmethod
    def watch_gradient_syncs(cls, record: Callable[[], None]) -> None:
        # The engine calls allreduce_gradients after every backward (in step() where the script
        # manages the accumulation itself, and not inside engine.no_sync()); it averages the
        # gradients over the ranks there only at a gradient accumulation boundary, the last of
        # gradient_accumulation_steps backward passes. (ZeRO stages 2 and 3 also reduce-scatter
        # every micro-batch's gradients into their partitions, by design: not counted.)
        from deepspeed.runtime.engine import DeepSpeedEngine

        allreduce = DeepSpeedEngine.allreduce_gradients

        def watched(engine: DeepSpeedEngine, *args: Any, **kwargs: Any) -> Any:
            if engine.is_gradient_accumulation_boundary():
                record()
            return allreduce(engine, *args, **kwargs)

        DeepSpeedEngine.allreduce_gradients = watched  # type: ignore[method-assign]


class DeepSpeedBackend(TorchDistributedBackend):
    """deepspeed.initialize on a torch optimizer; the harness sets the LR, no DeepSpeed scheduler."""

    name = "deepspeed"
    local_launcher = "deepspeed"
    library = "deepspeed"
    install_hint = compat.DEEPSPEED_INSTALL
    checkpoint_format = "deepspeed"
    script_hooks = DeepSpeedScriptHooks
    # DeepSpeed 0.19 broadcasts each weight as raw bytes (p.data.view(torch.uint8)), which a
    # channels-last 4-D weight cannot give, and ZeRO flattens weights into contiguous buffers.
    channels_last_weights = False
    # DeepSpeed's accelerators (deepspeed.accelerator) cover CUDA, ROCm (as cuda), XPU and the CPU.
    devices = ("cuda", "rocm", "xpu", "cpu")

    @dataclass(frozen=True)
    class Options(BaseOptions):
        """The ZeRO stage: 1 partitions the optimizer state over the ranks, 2 the gradients too,
        3 the weights too. It changes the checkpoint's files, not the math. The bucket size changes
        neither: DeepSpeed's default, 5e8 elements (1.9 GiB of float32), is a buffer ZeRO-3
        allocates whole whatever the model's size (the record's memory.model_state_bytes_per_rank
        counts it under `framework`); DDP's buckets are 25 MiB."""

        zero_stage: int = option(0, "--zero-stage", "deepspeed: ZeRO stage 0-3", resume_must_match=True)
        zero_bucket_mb: Optional[float] = option(
            None,
            "--zero-bucket-mb",
            "deepspeed: MiB of float32 gradients per ZeRO reduce and all-gather bucket "
            "(DeepSpeed's reduce_bucket_size and allgather_bucket_size; default DeepSpeed's 5e8 elements, 1.9 GiB)",
            type=float,
        )
        zero_sub_group_mb: Optional[float] = option(
            None,
            "--zero-sub-group-mb",
            "deepspeed: ZeRO-3 steps the optimizer over this rank's slice in sub-groups of this many MiB of "
            "float32, each making three copies of its size (DeepSpeed's sub_group_size; default 1e9 elements)",
            type=float,
            resume_must_match=True,  # ZeRO-3's checkpoint keeps the optimizer state per sub-group
        )
        zero_gathered_mb: Optional[float] = option(
            None,
            "--zero-gathered-mb",
            "deepspeed: ZeRO-3 keeps at most this many MiB of float32 weights gathered besides the module at work, "
            "prefetches as many, and frees a weight not used again within as many (stage3_max_live_parameters, "
            "stage3_prefetch_bucket_size, stage3_max_reuse_distance; default 1e9, 5e7, 1e9 elements): less memory, "
            "each weight gathered again for backward",
            type=float,
        )

        def validate(self) -> None:
            if self.zero_stage not in (0, 1, 2, 3):
                raise UsageError(f"{self.flag('zero_stage')} must be 0, 1, 2 or 3, got {self.zero_stage}")
            for name in ("zero_bucket_mb", "zero_sub_group_mb", "zero_gathered_mb"):
                mib = getattr(self, name)
                if mib is not None and not mib * 2**20 >= FLOAT32_BYTES:
                    raise UsageError(
                        f"{self.flag(name)} must hold at least one float32 ({FLOAT32_BYTES} bytes), got {mib}"
                    )
            for name in ("zero_sub_group_mb", "zero_gathered_mb"):
                if getattr(self, name) is not None and self.zero_stage != 3:
                    raise UsageError(f"{self.flag(name)} is ZeRO-3's: give it with {self.flag('zero_stage')} 3")

        @classmethod
        def examples(cls) -> tuple[DeepSpeedBackend.Options, ...]:
            # Each stage communicates and saves otherwise: ZeRO-1 all-gathers the weights in the
            # optimizer step; ZeRO-2 reduces inside backward and writes the optimizer state
            # partitioned, one file per rank; ZeRO-3 gathers the weights inside forward too.
            return (cls(), cls(zero_stage=1), cls(zero_stage=2), cls(zero_stage=3))

    options: Options

    def init(self, cluster: ClusterEnv, device: torch.device) -> None:
        if device.type == "cpu":
            # Must be set before DeepSpeed is imported: it picks its accelerator at import time.
            self._set_environ(DS_ACCELERATOR=os.environ.get("DS_ACCELERATOR", "cpu"))
        # Without DeepSpeed's CPU shared-memory op (compat.deepspeed_shm_op_stand_in says why; tested
        # in tests/integration/test_failures.py). Put back at shutdown.
        comm_torch, stand_ins = compat.deepspeed_shm_op_stand_in()
        self._set_attributes(comm_torch, **stand_ins)
        super().init(cluster, device)
        self._groups_before_run = compat.process_groups()

    def wrap(
        self, model: nn.Module, make_optimizer: OptimizerFactory, local_batch: int
    ) -> tuple[nn.Module, torch.optim.Optimizer]:
        import deepspeed

        device = next(model.parameters()).device
        # DeepSpeed moves the engine to GPU LOCAL_RANK unless told; with --procs-per-gpu K the
        # rank's GPU is local_rank // K, where the loop has put the model already.
        placement = SimpleNamespace(device_rank=device.index) if device.type != "cpu" else None
        engine, optimizer, _, _ = deepspeed.initialize(
            args=placement,
            model=model,
            optimizer=make_optimizer(model.parameters()),
            config=deepspeed_config(self.settings, self.options, local_batch, dist.get_world_size()),
            dist_init_required=False,
        )
        self.engine = self.model = engine
        self.optimizer = optimizer
        self._meter_cached_functions()
        # At world size 1 the mean over ranks is the identity, yet ZeRO-0 would still flatten, scale
        # and copy back every gradient after each backward: turned off, as Horovod skips it at size
        # 1, so a one-rank baseline holds no communication (harness.training.timing). ZeRO >= 1
        # moves gradients into its partitions on that path: it stays.
        if dist.get_world_size() == 1 and self.options.zero_stage == 0:
            engine.enable_backward_allreduce = False
        # DeepSpeed scales fp16 losses with a GradScaler of its own; the harness checks that it
        # scales as the other backends do, and reads it to count skipped steps.
        self.scaler = compat.deepspeed_grad_scaler(engine, optimizer)
        if self.precision.loss_scaling:
            check_loss_scaler(self.scaler)
        return engine, optimizer

    def _meter_cached_functions(self) -> None:
        """deepspeed.comm's TorchBackend keeps torch.distributed's all-gather and reduce-scatter
        functions it found when it was made (perhaps in an earlier run in this process): the
        metered ones for this run (harness.backends.collectives), put back at shutdown."""
        from deepspeed.comm import comm

        functions = self.collective_functions
        if comm.cdb is None or not functions:
            return
        cached = {"all_gather_function": "all_gather_into_tensor", "reduce_scatter_function": "reduce_scatter_tensor"}
        self._set_attributes(
            comm.cdb,
            **{
                attribute: functions[name]
                for attribute, name in cached.items()
                if getattr(comm.cdb, attribute, None) is not None and name in functions
            },
        )

    @property
    def reaches_same_parameters(self) -> bool:
        # ZeRO-1/2 reduce only the gradients a rank has (sizes then differ between ranks); ZeRO-3
        # gathers per module that runs. ZeRO-0 allreduces a zero gradient for a missing one.
        return self.options.zero_stage >= 1

    @property
    def forward_gathers(self) -> bool:
        return self.options.zero_stage == 3

    def after_evaluation(self) -> None:
        # Forwards without a backward leave ZeRO-3's weights gathered, or in flight where it
        # prefetched the next module: partitioning one in flight (saving the model) fails.
        if self.options.zero_stage == 3:
            self.engine.empty_partition_cache()

    def compile(self, model: nn.Module) -> nn.Module:
        # engine.compile() compiles the module inside the engine in place (nn.Module.compile), with
        # the accelerator's compile backend: the engine's forward, hooks and ZeRO stay outside the graph.
        self.engine.compile()
        self.compiled = "engine.compile()"
        return model

    def backward(self, loss: torch.Tensor, sync: bool) -> None:
        # The loop has divided the loss by the number of micro-batches already, for every backend.
        self.engine.backward(loss, scale_wrt_gas=False)
        if not sync:
            # DeepSpeed counts micro-batches in step(): before the step's last micro-batch (its
            # accumulation boundary) step() only advances the count; it communicates and steps there.
            self.engine.step()

    def step(self) -> None:
        scale = self.scaler.get_scale() if self.scaler is not None else None
        if self.options.zero_stage == 0:
            # ZeRO-0 gives a parameter without a gradient a zero one when it allreduces; at world
            # size 1 it does not allreduce (wrap), so the harness does it, as for every backend.
            zero_missing_gradients(self.optimizer)
        self.engine.step()  # unscales and clips per the config, steps, and zeroes the gradients
        if self.options.zero_stage == 3:
            compat.clear_zero3_gradient_partitions(self.optimizer)
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
        self.engine.checkpoint_engine = compat.weights_only_checkpoint_engine()
        try:
            loaded, _ = self.engine.load_checkpoint(
                parent, tag=tag, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        except (pickle.UnpicklingError, RuntimeError, KeyError, ValueError, AssertionError, OSError) as exc:
            if self.is_peer_failure(exc):
                raise
            raise UsageError(
                f"DeepSpeed cannot load checkpoint {directory} ({first_line(exc)}); resume with the run's "
                "own settings, or use another --checkpoint-dir"
            ) from None
        if loaded is None:
            raise UsageError(f"DeepSpeed found no checkpoint in {directory}; resume from another one")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        if self.options.zero_stage < 3:
            return super().full_state_dict()
        import deepspeed

        # One weight gathered at a time (a collective, in the same order on every rank) and copied:
        # the rank holds the copy and one whole weight, not the model gathered and copied at once.
        state = {}
        for key, value in self.engine.module.state_dict(keep_vars=True).items():
            gathered = [value] if isinstance(value, nn.Parameter) else []  # buffers are never partitioned
            with deepspeed.zero.GatheredParameters(gathered, modifier_rank=None):
                state[key] = value.detach().cpu().clone()
        return state

    def traffic(self, shape: ModelShape, on_gpu: bool = True) -> list[Collective]:
        # ZeRO-0 allreduces the gradients after backward; ZeRO-1 reduce-scatters them after backward,
        # ZeRO-2 in buckets during it (overlap_comm is off by default below ZeRO-3: the backward waits
        # for each), and both all-gather the updated slices after the step. ZeRO-3 gathers each
        # module's weights before its forward (prefetched, overlap_comm on by default), again before
        # its backward those it did not keep (zero_regathered_modules), and
        # reduce-scatters the gradients in buckets as backward produces them.
        stage, total = self.options.zero_stage, shape.parameter_bytes
        mib = self.options.zero_bucket_mb
        bucket = int(mib * 2**20) if mib is not None else DEEPSPEED_BUCKET_ELEMENTS * FLOAT32_BYTES
        if stage == 0:
            return evenly("all_reduce", total, bucket, "after_backward", overlapped=False)
        if stage in (1, 2):
            phase = "after_backward" if stage == 1 else "backward_reduce"
            return evenly("reduce_scatter", total, bucket, phase, overlapped=False) + evenly(
                "all_gather", total, bucket, "after_step", overlapped=False
            )
        return (
            [Collective("all_gather", size, 1, "forward_gather", True) for size in zero_gathered_modules(shape)]
            + [
                Collective("all_gather", size, 1, "backward_gather", True)
                for size in zero_regathered_modules(shape, self.options)
            ]
            + evenly("reduce_scatter", total, bucket, "backward_reduce", overlapped=True)
        )

    def tuning(self) -> dict[str, Any]:
        return {
            "zero_stage": self.options.zero_stage,
            "process_group": self.group_backend,
            "throughput_timer": False,
            "gradient_allreduce": self.engine.enable_backward_allreduce,
            "zero_reduce_bucket_elements": self.engine.zero_reduce_bucket_size(),
            "zero_allgather_bucket_elements": self.engine.zero_allgather_bucket_size(),
            "zero_sub_group_elements": self.engine.zero_sub_group_size(),
            "zero_max_live_elements": self.engine.zero_max_live_parameters(),
            "zero_max_reuse_elements": self.engine.zero_max_reuse_distance(),
            "zero_prefetch_elements": self.engine.zero_prefetch_bucket_size(),
        }

    def versions(self) -> dict[str, str]:
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
        clones would stay behind (compat.destroy_deepspeed_groups releases them too).
        """
        before = getattr(self, "_groups_before_run", None)
        if before is not None and dist.is_initialized():
            compat.destroy_deepspeed_groups([group for group in compat.process_groups() if group not in before])
