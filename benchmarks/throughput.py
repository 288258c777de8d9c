"""What the harness costs: each backend against its own framework's bare loop, and the built-in CNN
through today's code against an earlier commit's, side by side in one run.

1. Every distributed backend at 2 ranks x 1 thread against the bare loop of its own framework
   (benchmarks/bare_loop.py): bare DDP, the textbook Horovod DistributedOptimizer loop, a bare
   DeepSpeed engine at the harness's default ZeRO stage, bare FSDP2 fully_shard. Same CNN, batch
   64 per rank, synthetic data, SGD with momentum, and the same allocator (the harness keeps freed
   CPU memory for the next step, --cpu-malloc reuse, and so do these bare loops). Goal: >= 0.97.
2. With --before REF: the harness at REF (a git worktree made for the run) against the harness
   now, `none` at 1 process and `ddp` at 2 ranks, on the same command line. Goal: >= 0.99.

Each round runs every variant once, in an order shuffled per round (seeded), so that the machine's
drift hits all alike; a ratio is taken round by round (paired) and its 95% interval is
harness.study.scaling.intervals.ratio_interval's, the one method the kit prints everywhere. Run it on an
otherwise idle machine. Usage:
    .venv/bin/python benchmarks/throughput.py [--rounds 6] [--steps 150] [--before REF]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator

from harness.backends import BACKENDS
from harness.process.launchers import launch_environment, launcher_command
from harness.study.scaling.intervals import ratio_interval
from harness.training.launch import launch_command

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SYSTEM, REUSE = "system", "reuse"
DISTRIBUTED = [name for name, cls in BACKENDS.items() if cls.max_world_size is None]
# The bare loop of each backend's framework, and the launcher its documentation runs it under.
BARE = {"ddp": ("ddp", "torchrun"), "horovod": ("horovod", "horovodrun"), "deepspeed": ("deepspeed", "torchrun")}
BARE["fsdp"] = ("fsdp", "torchrun")
BACKEND_GOAL, BEFORE_GOAL = 0.97, 0.99
SEED = 0


def _json_line(command: list[str], env: dict[str, str], cwd: str = REPO) -> dict:
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=900)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{out.stderr[-2000:]}")
    # horovodrun prefixes each line with "[rank]<stdout>:"
    return json.loads([line[line.index("{") :] for line in out.stdout.splitlines() if "{" in line][-1])


def bare(steps: int, threads: int, ranks: int, cpu_malloc: str, framework: str = "") -> float:
    """Samples/s of benchmarks/bare_loop.py: `framework`'s loop (default: torch at 1 rank, ddp at more)."""
    framework = framework or ("torch" if ranks == 1 else "ddp")
    script = [os.path.join(HERE, "bare_loop.py"), "--framework", framework, "--steps", str(steps)]
    script += ["--threads", str(threads), "--cpu-malloc", cpu_malloc]
    if ranks == 1:
        return _json_line([sys.executable, *script], launch_environment())["throughput"]
    launcher = BARE.get(framework, (framework, "torchrun"))[1]
    return _json_line(launcher_command(launcher, ranks, script), launch_environment())["throughput"]


def harness(backend: str, ranks: int, steps: int, threads: int, tree: str = REPO) -> float:
    """Samples/s of `harness train` on the synthetic CNN, run from the source tree `tree`."""
    with tempfile.TemporaryDirectory() as scratch:
        results = os.path.join(scratch, "r.jsonl")
        args = ["--dataset", "synthetic", "--model", "cnn", "--batch-size", "64", "--threads", str(threads)]
        args += ["--max-steps", str(steps + 5), "--eval-every", "0", "--results", results]
        command = launch_command(ranks, backend, args)
        if ranks == 1:
            command = [sys.executable, "-m", "harness", "train", "--backend", backend, *args]
        env = {**launch_environment(), "PYTHONPATH": tree}  # ahead of the installed (editable) harness
        out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree, timeout=900)
        if out.returncode:
            raise SystemExit(f"failed: {' '.join(command)}\n{out.stderr[-2000:]}")
        with open(results) as handle:
            return json.loads(handle.readline())["throughput"]


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[str]:
    """A checkout of `ref` in a temporary directory, removed afterwards."""
    path = tempfile.mkdtemp(prefix="harness-before-")
    subprocess.run(["git", "-C", REPO, "worktree", "add", "--detach", path, ref], check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", REPO, "worktree", "remove", "--force", path], check=False, capture_output=True)


def measure(variants: dict[str, Callable[[], float]], rounds: int) -> dict[str, dict[str, float]]:
    """Each variant's samples/s per round, the variants shuffled within each round."""
    order, samples = random.Random(SEED), {name: {} for name in variants}
    for round_ in range(rounds):
        names = list(variants)
        order.shuffle(names)
        for name in names:
            samples[name][str(round_)] = variants[name]()
            print(f"round {round_ + 1}: {name:34s} {samples[name][str(round_)]:8.0f} samples/s", flush=True)
    return samples


def table(samples: dict[str, dict[str, float]], pairs: list[tuple[str, str]], goal: float) -> None:
    """One row per (variant, reference): the mean samples/s of both and the paired ratio's interval."""
    print(
        "| variant | samples/s | reference | samples/s | ratio | 95% interval | goal |\n|---|---|---|---|---|---|---|"
    )
    for name, reference in pairs:
        mine, theirs = samples[name], samples[reference]
        ratio = sum(mine.values()) / sum(theirs.values())
        interval = ratio_interval(mine, theirs)
        shown = f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "n/a"
        verdict = "met" if interval and interval[0] >= goal else "not shown" if interval is None else "open"
        print(
            f"| {name} | {statistics.fmean(mine.values()):.0f} | {reference} | {statistics.fmean(theirs.values()):.0f} | {ratio:.3f} | {shown} | "
            f">= {goal} ({verdict}) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--backends", default=",".join(DISTRIBUTED), help="default: every distributed backend")
    parser.add_argument("--before", metavar="REF", help="also compare the harness at this commit with now")
    args = parser.parse_args()
    backends = [name for name in args.backends.split(",") if name]
    unknown = sorted(set(backends) - set(BARE))
    if unknown:
        parser.error(f"no bare loop for {', '.join(unknown)}; choose from {', '.join(BARE)}")
    steps = args.steps
    variants: dict[str, Callable[[], float]] = {}
    for backend in backends:
        variants[f"harness {backend}"] = lambda b=backend: harness(b, 2, steps, 1)
        variants[f"bare {backend}"] = lambda b=backend: bare(steps, 1, 2, REUSE, BARE[b][0])
    with contextlib.ExitStack() as stack:
        if args.before:
            before = stack.enter_context(worktree(args.before))
            for backend, ranks in (("none", 1), ("ddp", 2)):
                variants[f"harness {backend} x{ranks}, now"] = lambda b=backend, r=ranks: harness(b, r, steps, 1)
                variants[f"harness {backend} x{ranks}, {args.before}"] = lambda b=backend, r=ranks: harness(
                    b, r, steps, 1, before
                )
        samples = measure(variants, args.rounds)
    print(f"\nCNN, batch 64 per rank, {steps} timed steps, {args.rounds} interleaved rounds; ratios paired by round\n")
    print("Each backend at 2 ranks x 1 thread against its framework's bare loop (allocator held equal):\n")
    table(samples, [(f"harness {b}", f"bare {b}") for b in backends], BACKEND_GOAL)
    if args.before:
        print(f"\nThe harness now against {args.before}:\n")
        pairs = [(f"harness {b} x{r}, now", f"harness {b} x{r}, {args.before}") for b, r in (("none", 1), ("ddp", 2))]
        table(samples, pairs, BEFORE_GOAL)


if __name__ == "__main__":
    main()
