"""What the step breakdown costs: throughput with it (phase marks, every collective metered) against
without it (--no-step-breakdown), for every backend and option set (their Options examples) at 2
ranks x 1 thread, and the single-process baseline at 1 rank. Goal: on / off >= 0.99.

Runs are paired: each round runs a configuration on and off back to back, in an order that swaps
every round, so drift in the machine's load hits both alike. Each round gives one ratio on / off;
the figure is the geometric mean of the rounds' ratios with a 95% Student's t interval over their
logarithms. A shared or loaded machine widens the interval: say so beside the figures. Usage:
    .venv/bin/python benchmarks/breakdown_cost.py [--repeats 5] [--steps 60] [--backends ddp,fsdp]
"""

from __future__ import annotations

import argparse
import math
import statistics

from harness.backends import BACKENDS
from harness.training.launch import launched_record
from harness.training.record import mean_and_ci95


def throughput(backend: str, flags: list[str], steps: int, breakdown: bool) -> float:
    """Samples per second of the timed window of one run."""
    ranks = 1 if BACKENDS[backend].max_world_size == 1 else 2
    args = [*flags, "--dataset", "synthetic", "--model", "cnn", "--batch-size", "32", "--threads", "1"]
    args += ["--max-steps", str(steps + 5), "--eval-every", "0"]
    if not breakdown:
        args.append("--no-step-breakdown")
    return launched_record(ranks, backend, args)["throughput"]


def ratio_interval(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of `ratios` and its 95% Student's t interval (over the logarithms; nan with one)."""
    spread = mean_and_ci95([math.log(ratio) for ratio in ratios])
    half = spread["ci95"] if spread["ci95"] is not None else math.nan
    return math.exp(spread["mean"]), math.exp(spread["mean"] - half), math.exp(spread["mean"] + half)


def configurations(names: list[str]) -> list[tuple[str, list[str]]]:
    return [(name, example.to_flags()) for name in names for example in BACKENDS[name].Options.examples()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="backends (default: every registered one)")
    args = parser.parse_args()
    names = [name for name in args.backends.split(",") if name]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backends: {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    rows = []
    for backend, flags in configurations(names):
        label = " ".join([backend, *flags])
        on: list[float] = []
        off: list[float] = []
        for repeat in range(args.repeats):
            order = (True, False) if repeat % 2 == 0 else (False, True)
            for breakdown in order:
                (on if breakdown else off).append(throughput(backend, flags, args.steps, breakdown))
            print(f"{label}, round {repeat + 1}: on {on[-1]:.0f}, off {off[-1]:.0f} samples/s", flush=True)
        rows.append(
            (label, statistics.median(on), statistics.median(off), ratio_interval([a / b for a, b in zip(on, off)]))
        )
    print(f"\nCNN, batch 32 per rank, {args.steps} timed steps, {args.repeats} paired rounds\n")
    print("| configuration | on (samples/s) | off (samples/s) | on / off | 95% interval |\n|---|---|---|---|---|")
    for label, on_median, off_median, (ratio, low, high) in rows:
        print(f"| {label} | {on_median:.0f} | {off_median:.0f} | {ratio:.3f} | {low:.3f} - {high:.3f} |")


if __name__ == "__main__":
    main()
