"""1 -> 2 rank weak-scaling efficiency of every backend on this machine, through `harness sweep`.

The workshop CNN, batch 64 per worker, synthetic data, one thread per worker (so two workers use
the cores one worker cannot: the CPU analogue of adding GPUs). One `harness sweep --scaling weak`
runs every registered backend (or --backends) on 1 and 2 ranks (`none` on 1 rank), repeats
interleaved, so all backends are measured by the same loop, window and formula. Then, if --bare-repeats > 0, the bare
PyTorch loop (1 process) and bare DDP loop (2 processes) of benchmarks/bare_loop.py give the same
ratio without the harness (with the harness's CPU memory setting, --cpu-malloc reuse, so that only
the loops differ). Prints the sweep's report, then efficiency = T(2) / (2 T(1)) per
backend. Figures on a shared machine move by 10% run to run: read them side by side. Usage:
    .venv/bin/python benchmarks/scaling.py [--repeats 3] [--steps 100] [--bare-repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from harness.backends import BACKENDS
from harness.process.launchers import launch_environment
from harness.study.scaling.report import scaling_report, scaling_rows
from harness.training.record import read_records

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from throughput import REUSE, bare  # noqa: E402  (the bare-loop runner the overhead benchmark uses)

WARMUP_STEPS = 5


def run_sweep(results: str, backends: list[str], repeats: int, steps: int) -> None:
    command = [
        sys.executable,
        "-m",
        "harness",
        "sweep",
        "--backends",
        ",".join(backends),
        "--ranks",
        "1,2",
        "--scaling",
        "weak",
        "--repeats",
        str(repeats),
        "--results",
        results,
        "--model",
        "cnn",
        "--dataset",
        "synthetic",
        "--batch-size",
        "64",
        "--threads",
        "1",
        "--max-steps",
        str(steps + WARMUP_STEPS),
        "--timing-warmup-steps",
        str(WARMUP_STEPS),
        "--eval-every",
        "0",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, env=launch_environment(), timeout=7200)
    if completed.returncode:
        raise SystemExit(
            f"sweep failed (exit {completed.returncode}):\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="sweep repeats per configuration")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per run")
    parser.add_argument("--bare-repeats", type=int, default=3, help="bare-loop pairs (0: skip)")
    parser.add_argument("--results", default=None, help="keep the sweep's records here (default: a temp file)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="backends to sweep (default: all registered)")
    args = parser.parse_args()
    backends = [name for name in args.backends.split(",") if name]

    with tempfile.TemporaryDirectory() as tmp:
        results = args.results or os.path.join(tmp, "scaling.jsonl")
        run_sweep(results, backends, args.repeats, args.steps)
        records = read_records([results])
    print(scaling_report(records))

    rows = {(row.backend, row.workers): row for row in scaling_rows(records)}
    print(
        f"\nWeak scaling 1 -> 2 ranks, CNN batch 64 per worker, 1 thread per worker, {args.steps} timed steps, "
        f"mean of {args.repeats} interleaved repeats\n"
    )
    print(
        "| backend | 1 rank samples/s | 2 ranks samples/s | efficiency T(2)/(2 T(1)) | POP parallel eff. (2 ranks) |"
    )
    print("|---|---|---|---|---|")
    for backend in backends:
        one, two = rows.get((backend, 1)), rows.get((backend, 2))
        if one is None:
            continue
        if two is None:
            print(f"| {backend} | {one.throughput:,.0f} | - | - | - |")
            continue
        print(
            f"| {backend} | {one.throughput:,.0f} | {two.throughput:,.0f} | {two.efficiency:.3f} | "
            f"{two.parallel_efficiency:.3f} |"
        )

    if args.bare_repeats:
        samples: dict[str, list[float]] = {"bare loop, 1 process": [], "bare DDP, 2 processes": []}
        for _ in range(args.bare_repeats):  # interleaved pairs
            samples["bare loop, 1 process"].append(bare(args.steps, 1, 1, REUSE))
            samples["bare DDP, 2 processes"].append(bare(args.steps, 1, 2, REUSE))
        one, two = (statistics.median(samples[name]) for name in samples)
        print(f"| bare loops with reuse (reference, medians) | {one:,.0f} | {two:,.0f} | {two / (2 * one):.3f} | - |")


if __name__ == "__main__":
    main()
