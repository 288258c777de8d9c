"""`harness bench allreduce`: any backend's allreduce timed per message size, and the alpha-beta
model of a ring allreduce fitted to it.

Every rank joins the job through the backend (Backend.init, as a training run does) and times
`start_all_reduce_sum` + its wait on float32 tensors of each size, so what is measured is the
communicator a training run of that backend uses (DDP's and DeepSpeed's process group, Horovod's
controller and fusion). Per size: a warm-up, then as many repetitions as fit `seconds_per_size`
(the count agreed by all ranks, since each repetition is a collective); the time of a size is the
slowest rank's mean. As nccl-tests reports them: algbw = size / time, busbw = algbw x 2(n-1)/n,
the bandwidth each rank's link must carry in a ring allreduce.

The model (NCCL's tuner's for a ring allreduce of S bytes over n ranks) is
    time = steps x alpha + 2(n-1)/n x S / busbw,   steps = 2(n-1),
fitted by least squares on relative errors (every size counts alike, whether it takes 10 us or
1 s). One rank communicates nothing: no fit.

Ranks start like `harness launch`: with `ranks` set, this process starts them through the
backend's local launcher (or `launcher`); without, this process is a rank of whatever launched it
(mpiexec or srun inside an allocation, for a benchmark across nodes). The model, the fit and the
printed table are in harness.study.prediction.allreduce (no torch).

`bench_collectives` times several collectives in one go: `harness bench allreduce --backend B`
without --collective times every collective B issues (`backend_collectives`: FSDP's and ZeRO's
all-gathers and reduce-scatters), each written to its own results file, so that `harness predict
--network` prices each of a backend's calls from its own measurement.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ...backends import Backend, BackendSettings, backend_class, get_backend
from ...errors import UsageError
from ...process.accelerator import select_device
from ...process.discovery import ClusterEnv, detect_cluster
from ...process.launchers import launch_environment, local_launcher
from ...process.state import preserved_process_state
from ...training.contention import CpuMeter, own_demand, usable_cores
from ...training.metrics import contention_summary
from ...training.placement import check_device
from ...training.timing import device_waiter
from .allreduce import ELEMENT_BYTES, RING_STEPS, BenchSettings, fit_alpha_beta, repeats_for, size_result


def bench_allreduce(settings: BenchSettings) -> dict[str, Any]:
    """Measure (or, with settings.ranks, launch ranks that measure) settings.collective and return
    the result; rank 0 writes it to settings.results. Bad input raises UsageError before any rank starts."""
    return bench_collectives(settings, (settings.collective,))[0]


def backend_collectives(backend: str, options: Optional[Mapping[str, Any]] = None) -> tuple[str, ...]:
    """The collectives `harness bench` times that `backend` with `options` issues in a training step
    (its declared traffic, harness.backends.traffic, on a CPU or a GPU); all_reduce where it issues none."""
    from ...backends.traffic import ModelShape
    from .predict import backend_traffic

    shape = ModelShape(2**20)
    issued = {call.kind for gpu in (False, True) for call in backend_traffic(backend, options or {}, shape, gpu)}
    return tuple(kind for kind in RING_STEPS if kind in issued) or ("all_reduce",)


def results_path(path: Optional[str], collective: str, several: bool) -> Optional[str]:
    """Where one collective's result goes: `path` itself, or with several 'bench.json' ->
    'bench-all_gather.json'."""
    if not path or not several:
        return path
    stem, extension = os.path.splitext(path)
    return f"{stem}-{collective}{extension or '.json'}"


def bench_collectives(settings: BenchSettings, collectives: Sequence[str]) -> list[dict[str, Any]]:
    """Each of `collectives` benchmarked as bench_allreduce does (a launch each with settings.ranks,
    else all on this rank's one process group), with several each in its own `results_path`."""
    several = len(collectives) > 1
    each = [
        replace(settings, collective=kind, results=results_path(settings.results, kind, several))
        for kind in collectives
    ]
    for one in each:
        one.check()
    get_backend(settings.backend).check_available()
    if settings.ranks is not None:
        return [_launch(one) for one in each]
    results = measure_on_this_rank(each)
    for one, result in zip(each, results):
        if result["rank"] == 0 and one.results:
            _write(one.results, result)
    return results


def _write(path: str, result: dict[str, Any]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w") as handle:
        json.dump(result, handle, indent=1, allow_nan=False)


def worker_flags(settings: BenchSettings, results: str) -> list[str]:
    """The `harness bench allreduce` flags each launched rank runs with (all but -n and --launcher)."""
    return [
        "--backend",
        settings.backend,
        "--collective",
        settings.collective,
        "--sizes",
        ",".join(str(size) for size in settings.sizes),
        "--seconds-per-size",
        str(settings.seconds_per_size),
        "--min-repeats",
        str(settings.min_repeats),
        "--max-repeats",
        str(settings.max_repeats),
        "--device",
        settings.device,
        "--timeout",
        str(settings.timeout),
        "--results",
        results,
        "--quiet",
    ]


def launch_command(settings: BenchSettings, results: str) -> list[str]:
    """The command that starts settings.ranks local ranks of the benchmark, as `harness launch` would."""
    assert settings.ranks is not None
    backend = backend_class(settings.backend)
    chosen = local_launcher(settings.launcher or backend.local_launcher)
    limit = backend.max_world_size or chosen.max_processes
    if limit is not None and settings.ranks > limit:
        raise UsageError(
            f"backend {settings.backend!r} runs {limit} process(es); use -n {limit} or a distributed backend"
        )
    return chosen.command(settings.ranks, ["-m", "harness", "bench", "allreduce", *worker_flags(settings, results)])


def _launch(settings: BenchSettings) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as scratch:
        results = settings.results or os.path.join(scratch, "allreduce.json")
        command = launch_command(settings, results)
        print(f"== {shlex.join(command[:4])} ... ({settings.ranks} ranks, {len(settings.sizes)} sizes)", flush=True)
        limit = settings.timeout + 60 * len(settings.sizes)
        completed = subprocess.run(command, env=launch_environment(), timeout=limit)
        if completed.returncode != 0 or not os.path.exists(results):
            raise UsageError(
                f"the benchmark's ranks failed (exit {completed.returncode}); run the command above "
                "to see why, or try another --backend"
            )
        with open(results) as handle:
            return json.load(handle)


def _slowest(
    backend: Backend, rank: int, world_size: int, values: list[float], device: torch.device
) -> list[list[float]]:
    """Every rank's `values` ([value][rank]), in one allreduce of a table each rank fills its column of
    (on the rank's device where its process group's communicator takes only device tensors)."""
    table = torch.zeros(len(values), world_size, dtype=torch.float64)
    table[:, rank] = torch.tensor(values, dtype=torch.float64)
    on_device = getattr(backend, "group_backend", "gloo") != "gloo"
    return backend.all_reduce_sum(table.to(device if on_device else torch.device("cpu"))).cpu().tolist()


def _start(backend: Backend, kind: str, send: torch.Tensor, receive: torch.Tensor, name: str) -> Callable[[], Any]:
    """Start one collective of `kind` (harness.backends.traffic.KINDS); the function that waits.
    all_reduce sums `send` in place through the backend's own communicator (Horovod's controller
    too); all_gather fills `receive` with every rank's `send` and reduce_scatter leaves this rank's
    slice of the sum of `send` in `receive`, on the run's torch.distributed process group."""
    if kind == "all_reduce":
        return backend.start_all_reduce_sum(send, name)
    if not dist.is_initialized():
        raise UsageError(
            f"backend {backend.name!r} has no process group to time {kind} on; use --backend ddp for {kind}"
        )
    start = dist.all_gather_into_tensor if kind == "all_gather" else dist.reduce_scatter_tensor
    work = start(receive, send, async_op=True)
    return lambda: (work.wait(), receive)[1]


def _time_size(
    backend: Backend, size: int, device: torch.device, settings: BenchSettings, cluster: ClusterEnv
) -> dict[str, Any]:
    """The mean seconds of one collective of `size` bytes (the whole buffer) on this rank,
    repetitions agreed by all ranks."""
    kind, ranks = settings.collective, cluster.world_size
    piece = max(1, size // ELEMENT_BYTES // (1 if kind == "all_reduce" else ranks))
    whole = torch.zeros(piece * (1 if kind == "all_reduce" else ranks), dtype=torch.float32, device=device)
    part = whole if kind == "all_reduce" else torch.zeros(piece, dtype=torch.float32, device=device)
    send, receive = (part, whole) if kind == "all_gather" else (whole, part)
    name = f"harness.bench.{kind}.{size}"  # one name per size: Horovod negotiates it once
    wait_for_device = device_waiter(device)

    def start() -> Callable[[], torch.Tensor]:
        return _start(backend, kind, send, receive, name)

    def once() -> float:
        begin = time.perf_counter()
        start()()
        wait_for_device()
        return time.perf_counter() - begin

    once()  # the first of a size allocates buffers (and Horovod negotiates its name)
    warmup = _slowest(backend, cluster.rank, cluster.world_size, [once()], device)[0]
    repeats = repeats_for(max(warmup), settings)  # the same count on every rank: each repetition is a collective
    backend.barrier()
    begin = time.perf_counter()
    for _ in range(repeats):
        start()()
    wait_for_device()
    mean = (time.perf_counter() - begin) / repeats
    slowest = max(_slowest(backend, cluster.rank, cluster.world_size, [mean], device)[0])
    return size_result(whole.numel() * ELEMENT_BYTES, slowest, cluster.world_size, repeats, kind)


def _timed(
    backend: Backend, cluster: ClusterEnv, device: torch.device, measure: Callable[[], list[dict[str, Any]]]
) -> dict[str, Any]:
    meter = CpuMeter(threads=None, demand=own_demand(None, backend.helper_threads, 0))
    meter.open()
    lines = measure()
    meter.close()
    columns = _slowest(backend, cluster.rank, cluster.world_size, meter.values(), device)
    per_rank = {name: [v if v >= 0 else None for v in column] for name, column in zip(CpuMeter.FIELDS, columns)}
    contention = contention_summary(per_rank, meter.demand_words)
    loads = [v for v in per_rank["load_average"] if v is not None]
    return {
        "sizes": lines,
        "contention": contention,
        "load_average": max(loads) if loads else None,
        "cores": usable_cores(),
    }


def measure_on_this_rank(each: Sequence[BenchSettings]) -> list[dict[str, Any]]:
    """This rank's part of the benchmark of each settings' collective, on one process group; every
    rank returns the same results."""
    settings, started = each[0], time.time()
    backend = get_backend(settings.backend, settings=BackendSettings(timeout=settings.timeout))
    with preserved_process_state():
        cluster = detect_cluster()
        device = select_device(settings.device, cluster)
        check_device(type(backend), device)
        backend.check_launch(cluster, device)
        backend.init(cluster, device)
        try:
            measured = [
                _timed(
                    backend,
                    cluster,
                    device,
                    lambda one=one: [_time_size(backend, size, device, one, cluster) for size in one.sizes],
                )
                for one in each
            ]
            backend.barrier()
        finally:
            backend.shutdown()
    return [_result(one, cluster, device, backend, found, started) for one, found in zip(each, measured)]


def _result(
    settings: BenchSettings,
    cluster: ClusterEnv,
    device: torch.device,
    backend: Backend,
    measured: dict[str, Any],
    started: float,
) -> dict[str, Any]:
    """The result document of one collective's measurement (what --results writes)."""
    lines = measured["sizes"]
    fit = fit_alpha_beta(
        [line["bytes"] for line in lines], [line["seconds"] for line in lines], cluster.world_size, settings.collective
    )
    return {
        "kind": "allreduce-benchmark",
        "backend": settings.backend,
        "collective": settings.collective,
        "rank": cluster.rank,
        "world_size": cluster.world_size,
        "ranks_per_node": cluster.local_world_size,
        "nodes": cluster.world_size // max(1, cluster.local_world_size),
        "launcher": cluster.launcher,
        "device": device.type,
        **measured,
        "fit": fit,
        "started": started,
        "wall_time": time.time() - started,
        "hostname": socket.gethostname(),
        "tuning": _tuning(backend),
        "settings": {
            "seconds_per_size": settings.seconds_per_size,
            "min_repeats": settings.min_repeats,
            "max_repeats": settings.max_repeats,
        },
    }


def _tuning(backend: Backend) -> dict[str, Any]:
    try:
        return backend.tuning()
    except AttributeError:  # knobs that only exist once a model is wrapped
        return {}
