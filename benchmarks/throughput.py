"""Harness overhead against bare loops, measured side by side in one run (issue: harness core).

1. `--backend none` vs a bare PyTorch loop: same CNN, batch 64, same threads, one process.
2. Every backend at 2 ranks x 1 thread vs a bare DDP loop under torchrun. A textbook Horovod loop
   (DistributedOptimizer, Horovod's defaults, under horovodrun) is shown for reference: Horovod's
   synchronize spins and its 1 ms cycle wakes the background thread, both costly when ranks fill
   the cores, which the harness's backend avoids (harness/backends/horovod.py).

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
import tempfile
from typing import Dict, List

from harness.launch import launch_command, launch_environment, launcher_command

HERE = os.path.dirname(os.path.abspath(__file__))


def _json_line(command: List[str]) -> Dict:
    out = subprocess.run(command, capture_output=True, text=True, env=launch_environment(), timeout=900)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(command)}\n{out.stderr[-2000:]}")
    # horovodrun prefixes each line with "[rank]<stdout>:"
    return json.loads([line[line.index("{"):] for line in out.stdout.splitlines() if "{" in line][-1])


def bare(steps: int, threads: int, ranks: int, horovod: bool = False) -> float:
    script = [os.path.join(HERE, "bare_loop.py"), "--steps", str(steps), "--threads", str(threads)]
    if ranks == 1:
        return _json_line([sys.executable, *script])["throughput"]
    if horovod:
        return _json_line(launcher_command("horovodrun", ranks, [*script, "--horovod"]))["throughput"]
    return _json_line(launcher_command("torchrun", ranks, script))["throughput"]


def harness(backend: str, ranks: int, steps: int, threads: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "r.jsonl")
        args = ["--dataset", "synthetic", "--model", "cnn", "--batch-size", "64", "--threads", str(threads),
                "--max-steps", str(steps + 5), "--eval-every", "0", "--results", results]
        subprocess.run(launch_command(ranks, backend, args), check=True, capture_output=True,
                       env=launch_environment(), timeout=900)
        with open(results) as handle:
            return json.loads(handle.readline())["throughput"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--single-threads", type=int, default=1, help="threads for the one-process comparison")
    args = parser.parse_args()
    variants = {
        "bare loop, 1 process": lambda: bare(args.steps, args.single_threads, 1),
        "harness none, 1 process": lambda: harness("none", 1, args.steps, args.single_threads),
        "bare DDP, 2x1 thread": lambda: bare(args.steps, 1, 2),
        "bare Horovod, 2x1 thread": lambda: bare(args.steps, 1, 2, horovod=True),
        **{f"harness {b}, 2x1 thread": (lambda b=b: harness(b, 2, args.steps, 1)) for b in ("ddp", "horovod", "deepspeed")},
    }
    samples: Dict[str, List[float]] = {name: [] for name in variants}
    for repeat in range(args.repeats):
        for name, run in variants.items():
            samples[name].append(run())
            print(f"repeat {repeat + 1}: {name:28s} {samples[name][-1]:8.0f} samples/s", flush=True)
    median = {name: statistics.median(values) for name, values in samples.items()}
    print(f"\nCNN, batch 64 per process, {args.steps} timed steps, median of {args.repeats} interleaved repeats\n")
    print("| variant | samples/s (median) | ratio | goal |")
    print("|---|---|---|---|")
    print(f"| bare loop, 1 process ({args.single_threads} thread) | {median['bare loop, 1 process']:.0f} | 1.000 | |")
    ratio = median["harness none, 1 process"] / median["bare loop, 1 process"]
    print(f"| harness none, 1 process | {median['harness none, 1 process']:.0f} | {ratio:.3f} | >= 0.98 |")
    print(f"| bare DDP, 2 x 1 thread | {median['bare DDP, 2x1 thread']:.0f} | 1.000 | |")
    bare_horovod = median["bare Horovod, 2x1 thread"]
    print(f"| bare Horovod, 2 x 1 thread (reference) | {bare_horovod:.0f} | "
          f"{bare_horovod / median['bare DDP, 2x1 thread']:.3f} | |")
    for backend in ("ddp", "horovod", "deepspeed"):
        name = f"harness {backend}, 2x1 thread"
        print(f"| {name} | {median[name]:.0f} | {median[name] / median['bare DDP, 2x1 thread']:.3f} | >= 0.95 |")


if __name__ == "__main__":
    main()
