"""Harness overhead against bare loops, measured side by side in one run (issue: harness core).

1. `--backend none` vs a bare PyTorch loop: same CNN, batch 64, same threads, one process.
2. Every backend at 2 ranks x 1 thread vs a bare DDP loop under torchrun. A textbook Horovod loop
   (DistributedOptimizer, Horovod's defaults, under horovodrun) is shown for reference: Horovod's
   synchronize spins and its 1 ms cycle wakes the background thread, both costly when ranks fill
   the cores, which the harness's backend avoids (harness/backends/horovod.py).

The harness keeps freed CPU memory for the next step (--cpu-malloc reuse, harness/process/allocator.py);
a bare loop as users write it runs on glibc's defaults, which return it to the kernel every step.
Each bare loop therefore runs both ways: "as written" is the goal's reference, "reuse" holds the
allocator equal and isolates the loop's own overhead.

Runs are interleaved (A, B, C, A, B, C, ...) so machine noise hits every variant alike; the
figures are medians over repeats and the ratios are of medians. Usage:
    .venv/bin/python benchmarks/throughput.py [--repeats 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from harness.backends import BACKENDS
from harness.process.launchers import launch_environment, launcher_command
from harness.training.launch import launched_record

HERE = os.path.dirname(os.path.abspath(__file__))
SYSTEM, REUSE = "system", "reuse"
DISTRIBUTED = [name for name, cls in BACKENDS.items() if cls.max_world_size is None]


def _json_line(command: list[str]) -> dict:
    out = subprocess.run(command, capture_output=True, text=True, env=launch_environment(), timeout=900)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{out.stderr[-2000:]}")
    # horovodrun prefixes each line with "[rank]<stdout>:"
    return json.loads([line[line.index("{") :] for line in out.stdout.splitlines() if "{" in line][-1])


def bare(steps: int, threads: int, ranks: int, cpu_malloc: str, horovod: bool = False) -> float:
    script = [
        os.path.join(HERE, "bare_loop.py"),
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        "--cpu-malloc",
        cpu_malloc,
    ]
    if ranks == 1:
        return _json_line([sys.executable, *script])["throughput"]
    if horovod:
        return _json_line(launcher_command("horovodrun", ranks, [*script, "--horovod"]))["throughput"]
    return _json_line(launcher_command("torchrun", ranks, script))["throughput"]


def harness(backend: str, ranks: int, steps: int, threads: int) -> float:
    args = ["--dataset", "synthetic", "--model", "cnn", "--batch-size", "64", "--threads", str(threads)]
    return launched_record(ranks, backend, [*args, "--max-steps", str(steps + 5), "--eval-every", "0"])["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--single-threads", type=int, default=1, help="threads for the one-process comparison")
    parser.add_argument(
        "--backends",
        default=",".join(DISTRIBUTED),
        help="distributed backends to compare with the bare loops (default: all registered)",
    )
    args = parser.parse_args()
    backends = [name for name in args.backends.split(",") if name]
    unknown = sorted(set(backends) - set(DISTRIBUTED))
    if unknown:
        parser.error(f"unknown or not distributed: {', '.join(unknown)}; choose from {', '.join(DISTRIBUTED)}")
    steps, threads = args.steps, args.single_threads
    variants = {
        "bare loop, as written": lambda: bare(steps, threads, 1, SYSTEM),
        "bare loop, reuse": lambda: bare(steps, threads, 1, REUSE),
        "harness none": lambda: harness("none", 1, steps, threads),
        "bare DDP, as written": lambda: bare(steps, 1, 2, SYSTEM),
        "bare DDP, reuse": lambda: bare(steps, 1, 2, REUSE),
        "bare Horovod, as written": lambda: bare(steps, 1, 2, SYSTEM, horovod=True),
        **{f"harness {b}": (lambda b=b: harness(b, 2, steps, 1)) for b in backends},
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, run in variants.items():
            samples[name].append(run())
            print(f"repeat {repeat + 1}: {name:26s} {samples[name][-1]:8.0f} samples/s", flush=True)
    median = {name: statistics.median(values) for name, values in samples.items()}

    def row(name: str, references: list[str], goal: str = "") -> None:
        ratios = " | ".join(f"{median[name] / median[reference]:.3f}" for reference in references)
        print(f"| {name} | {median[name]:.0f} | {ratios} | {goal} |")

    print(f"\nCNN, batch 64 per process, {steps} timed steps, median of {args.repeats} interleaved repeats\n")
    print(f"One process, {threads} thread(s):\n")
    print("| variant | samples/s | vs bare loop as written | vs bare loop, reuse | goal |\n|---|---|---|---|---|")
    one = ["bare loop, as written", "bare loop, reuse"]
    for name in [*one, "harness none"]:
        row(name, one, ">= 0.98 vs as written" if name == "harness none" else "")
    print("\nTwo ranks x 1 thread:\n")
    print("| variant | samples/s | vs bare DDP as written | vs bare DDP, reuse | goal |\n|---|---|---|---|---|")
    two = ["bare DDP, as written", "bare DDP, reuse"]
    for name in [*two, "bare Horovod, as written"]:
        row(name, two)
    for backend in backends:
        row(f"harness {backend}", two, ">= 0.95 vs as written")


if __name__ == "__main__":
    main()
