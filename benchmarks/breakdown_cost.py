"""What the step breakdown costs: throughput with it (phase marks, every collective metered) against
without it (--no-step-breakdown), for every backend and option set (their Options examples) at 2
ranks x 1 thread, and the single-process baseline at 1 rank. Goal: on / off >= 0.99.

Runs are paired: each round runs a configuration on and off back to back, in an order that swaps
every round, so drift in the machine's load hits both alike. Each round gives one ratio on / off;
the figure is the geometric mean of the rounds' ratios with the studies' own 95% interval
(harness.study.scaling.intervals: Student's t over their logarithms, paired by round; none below 3 rounds).
A shared or loaded machine widens the interval, and an interval that excludes 1 at a few rounds
needs more rounds before it is believed.

Whole runs on this machine vary by 3-5% from one to the next, far more than the 1% at stake, so the
table also bounds the cost from what the breakdown adds to one step, measured in this process (as
benchmarks/heartbeat.py does): a step's four phase marks with the breakdown on against off, and one
metered collective (torch_distributed_wrappers on a one-rank gloo group) against the bare call, each
the best of interleaved rounds. Per configuration: the marks plus its runs' collectives per step
(from their records) times the metered call's extra, over its step time. DDP's buckets take one
more path with the breakdown on: DDP's Python allreduce_hook, so that the meter sees them, instead of
the reducer's C++ allreduce. Its extra is measured alone, as the 2-rank rows run it: DDP (buckets as
gradient views, as harness.backends.ddp wraps) on two ranks of a gloo group, a core each, the
metered hook against the built-in allreduce in interleaved rounds; the mean of the rounds' paired
differences, with its Student's t interval, is added to the rows whose buckets took the hook (their
records' tuning.comm_hook). On a GPU each mark also records a CUDA event; this CPU bound does not
cover that (benchmarks/gpu_throughput.py runs there).

Usage:
    .venv/bin/python benchmarks/breakdown_cost.py [--repeats 5] [--steps 60] [--backends ddp,fsdp] [--hook-rounds 15]
        [--hook-steps 30]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import random
import statistics
import time
from contextlib import nullcontext
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from harness.backends import BACKENDS
from harness.backends.collectives import CollectiveMeter, torch_distributed_wrappers
from harness.process.launchers import free_port
from harness.study.scaling import intervals
from harness.training.launch import launched_record
from harness.training.timing import StepTimer


def record_of(backend: str, flags: list[str], steps: int, breakdown: bool) -> dict[str, Any]:
    """The record of one run (its timed window's throughput, collectives and step time)."""
    ranks = 1 if BACKENDS[backend].max_world_size == 1 else 2
    args = [*flags, "--dataset", "synthetic", "--model", "cnn", "--batch-size", "32", "--threads", "1"]
    args += ["--max-steps", str(steps + 5), "--eval-every", "0"]
    if not breakdown:
        args.append("--no-step-breakdown")
    return launched_record(ranks, backend, args)


def best_of(rounds: int, variants: dict[bool, Callable[[], float]]) -> dict[bool, float]:
    """Each variant's least disturbed seconds per call over `rounds` interleaved rounds."""
    best = {variant: float("inf") for variant in variants}
    for _ in range(rounds):
        for variant, measure in variants.items():
            best[variant] = min(best[variant], measure())
    return best


def marks_added(steps: int = 20000, rounds: int = 7) -> float:
    """What a step's four phase marks add with the breakdown on (a meter attached, a window open)."""

    def per_step(enabled: bool) -> Callable[[], float]:
        timer = StepTimer(0, enabled=enabled)
        timer.collectives = CollectiveMeter()

        def measure() -> float:
            timer.open_window()
            started = time.perf_counter()
            for _ in range(steps):
                timer.waiting_for_data()
                timer.data_ready()
                timer.gradients_ready()
                timer.stepped()
            seconds = (time.perf_counter() - started) / steps
            timer.close_window()
            return seconds

        return measure

    best = best_of(rounds, {True: per_step(True), False: per_step(False)})
    return best[True] - best[False]


def metered_call_added(calls: int = 5000, rounds: int = 7) -> float:
    """What the meter adds to one collective: an async allreduce and its wait on a one-rank gloo
    group, through the stand-ins against the bare functions."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wrappers, wait = torch_distributed_wrappers(CollectiveMeter(), dist)
        tensor = torch.zeros(1)

        def per_call(metered: bool) -> Callable[[], float]:
            def measure() -> float:
                started = time.perf_counter()
                for _ in range(calls):
                    if metered:
                        wait(wrappers["all_reduce"](tensor, async_op=True))
                    else:
                        dist.all_reduce(tensor, async_op=True).wait()
                return (time.perf_counter() - started) / calls

            return measure

        best = best_of(rounds, {True: per_call(True), False: per_call(False)})
    finally:
        dist.destroy_process_group()
    return best[True] - best[False]


HOOK_VARIANTS = ("builtin", "hook", "metered")
ORDER_SEED = 0  # the variants' order within each round (printed with the table)


def _ddp_hook_rank(rank: int, port: int, steps: int, rounds: int, results: Any) -> None:
    """One of the two ranks of ddp_hook_steps, on a core of its own, one thread, as the runs above."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from harness.backends import compat
    from harness.data.builtin import synthetic_shape
    from harness.tasks.models import build_model

    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    (channels, size, _), classes = synthetic_shape("cnn")
    images, labels = torch.randn(32, channels, size, size), torch.randint(0, classes, (32,))
    bare, meter = dist.all_reduce, CollectiveMeter()
    functions = {"builtin": bare, "hook": bare, "metered": torch_distributed_wrappers(meter, dist)[0]["all_reduce"]}
    models = {}
    for variant in HOOK_VARIANTS:  # as harness.backends.ddp wraps the model
        model = build_model("cnn", channels, size, classes, seed=0)
        models[variant] = DistributedDataParallel(
            model, gradient_as_bucket_view=True, **compat.ddp_without_buffer_sync()
        )
        if variant != "builtin":
            models[variant].register_comm_hook(None, allreduce_hook)
    seconds: dict[str, list[float]] = {variant: [] for variant in HOOK_VARIANTS}
    order = random.Random(ORDER_SEED)  # the same order on both ranks: every step is collective
    for _ in range(rounds):
        for variant in order.sample(HOOK_VARIANTS, len(HOOK_VARIANTS)):
            model = models[variant]
            dist.all_reduce = functions[variant]  # what allreduce_hook calls, as the backend meters it
            dist.barrier()
            started = time.perf_counter()
            for _ in range(steps):
                model.zero_grad(set_to_none=True)
                with meter.waited_inside() if variant == "metered" else nullcontext():  # as DDPBackend.backward
                    torch.nn.functional.cross_entropy(model(images), labels).backward()
            seconds[variant].append((time.perf_counter() - started) / steps)
            dist.all_reduce = bare
    assert meter.snapshot()["all_reduce"][0] > 0, "the hook's allreduces did not reach the meter"
    if rank == 0:
        results.put(seconds)
    dist.destroy_process_group()


def ddp_hook_steps(steps: int = 30, rounds: int = 15) -> dict[str, list[float]]:
    """Seconds per step of the CNN (batch 32) under DDP on two ranks of a gloo group (two processes,
    a core each), round by round: with the reducer's built-in C++ allreduce ("builtin"), with DDP's
    Python allreduce_hook ("hook"), and with that hook's allreduce through the meter, as the breakdown
    runs it ("metered"). The variants take turns within each round in a seeded random order."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_ddp_hook_rank, args=(rank, port, steps, rounds, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + 60 + 3 * rounds * steps
    try:
        while True:  # until rank 0's timings come, a rank stops, or the time a slow run could take is up
            try:
                return results.get(timeout=1.0)
            except queue.Empty:
                stopped = [rank for rank, process in enumerate(ranks) if process.exitcode not in (None, 0)]
                if stopped or time.monotonic() > deadline:
                    reason = (
                        f"rank {stopped[0]} stopped with exit status {ranks[stopped[0]].exitcode}"
                        if stopped
                        else "timed out"
                    )
                    raise RuntimeError(f"DDP's hook timing on two ranks {reason}") from None
    finally:
        for process in ranks:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()


def hook_extra(seconds: dict[str, list[float]]) -> tuple[float, Optional[tuple[float, float]]]:
    """The metered hook's extra per step over the built-in allreduce: the mean of the rounds' paired
    differences and its 95% interval (harness.study.scaling.intervals.difference_interval)."""
    differences = [metered - builtin for metered, builtin in zip(seconds["metered"], seconds["builtin"])]
    return statistics.fmean(differences), intervals.difference_interval(differences)


def collectives_per_step(record: dict[str, Any]) -> float:
    """Collectives one rank issued per step in the record's timed window."""
    return sum(kind["count"] for kind in record["step_breakdown"].get("collectives", {}).values())


def configurations(names: list[str]) -> list[tuple[str, list[str]]]:
    return [(name, example.to_flags()) for name in names for example in BACKENDS[name].Options.examples()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="backends (default: every registered one)")
    parser.add_argument("--hook-rounds", type=int, default=15, help="interleaved rounds of DDP's three ways")
    parser.add_argument("--hook-steps", type=int, default=30, help="timed steps of each way in a round")
    args = parser.parse_args()
    names = [name for name in args.backends.split(",") if name]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends: {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    rows = []
    for backend, flags in configurations(names):
        label = " ".join([backend, *flags])
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for repeat in range(args.repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for breakdown in order:
                runs[breakdown].append(record_of(backend, flags, args.steps, breakdown))
            on, off = (runs[variant][-1]["throughput"] for variant in (True, False))
            print(f"{label}, round {repeat + 1}: on {on:.0f}, off {off:.0f} samples/s", flush=True)
        rows.append((label, runs))
    marks, call = marks_added(), metered_call_added()
    print(f"\nCNN, batch 32 per rank, {args.steps} timed steps, {args.repeats} paired rounds")
    print(f"added in this process: {marks * 1e6:.1f} us per step's marks, {call * 1e6:.1f} us per metered collective")
    hook = report_hook(ddp_hook_steps(args.hook_steps, args.hook_rounds), args.hook_rounds)
    print_table(rows, marks, call, hook)


def report_hook(ddp: dict[str, list[float]], rounds: int) -> tuple[float, float]:
    """Print DDP's three ways and the metered hook's extra; return that extra as the bound adds it, at
    its mean and at its interval's upper end (seconds per step)."""
    extra, interval = hook_extra(ddp)
    medians = {variant: statistics.median(seconds) * 1e3 for variant, seconds in ddp.items()}
    print(
        f"DDP on two ranks (a core each), {rounds} rounds in a random order (seed {ORDER_SEED}), median ms "
        "per step: built-in allreduce {builtin:.2f}, Python allreduce_hook {hook:.2f}, metered hook {metered:.2f}".format(
            **medians
        )
    )
    spread = f" (95% interval {interval[0] * 1e6:+.0f} to {interval[1] * 1e6:+.0f})" if interval else ""
    print(f"the metered hook's extra, mean of the rounds' paired differences: {extra * 1e6:+.0f} us per step{spread}")
    # A bound on a cost: a difference below zero is the rounds' noise (the hook adds to the built-in
    # allreduce's work), counted as no extra.
    hook = (max(extra, 0.0), max(interval[1] if interval else extra, 0.0))
    print(f"added to the rows whose buckets took it: {hook[0] * 1e6:.0f} us per step ({hook[1] * 1e6:.0f} at most)\n")
    return hook


def print_table(rows: list, marks: float, call: float, hook: tuple[float, float]) -> None:
    """Each configuration's whole-run ratio on / off and the bound from what its step adds in process,
    with the hook's extra at its mean and at its interval's upper end."""
    print(
        "| configuration | on (samples/s) | off (samples/s) | on / off | 95% interval | collectives per step "
        "| added per step (us) | bound on on / off | bound, hook at its upper end |\n|---|---|---|---|---|---|---|---|---|"
    )
    for label, runs in rows:
        on, off = ([run["throughput"] for run in runs[variant]] for variant in (True, False))
        ratio = intervals.geometric_mean([a / b for a, b in zip(on, off)])
        paired = intervals.ratio_interval(dict(enumerate(on)), dict(enumerate(off)))
        spread = f"{paired[0]:.3f} - {paired[1]:.3f}" if paired else intervals.missing()
        calls = statistics.median(collectives_per_step(run) for run in runs[True])
        hooked = any(run.get("tuning", {}).get("comm_hook") for run in runs[True])  # its buckets took the hook
        added, most = (marks + calls * call + (extra if hooked else 0.0) for extra in hook)
        step = statistics.median(run["global_batch"] / run["throughput"] for run in runs[False])
        print(
            f"| {label} | {statistics.median(on):.0f} | {statistics.median(off):.0f} | {ratio:.3f} | {spread} "
            f"| {calls:.1f} | {added * 1e6:.1f} | {1 - added / step:.5f} | {1 - most / step:.5f} |"
        )


if __name__ == "__main__":
    main()
