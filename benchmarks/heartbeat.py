"""What the heartbeat costs: throughput with it on (the default) and off (--no-heartbeat), side by side.

DDP, 2 ranks x 1 thread under torchrun, the workshop CNN, batch 64 per rank on synthetic data. The
two variants run in interleaved pairs whose order alternates (on, off; off, on; ...), so that the
machine's drift hits both alike; each pair gives one ratio (on / off), and the table shows the
median ratio with the range of the middle ratios and a 95% bootstrap interval of the median. The
goal (harness.process.heartbeat) is a ratio >= 0.99. Usage:
    .venv/bin/python benchmarks/heartbeat.py [--pairs 8] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile

from harness.process.launchers import launch_environment
from harness.training.launch import launch_command

BACKEND, RANKS = "ddp", 2
GOAL = 0.99
BOOTSTRAP_SAMPLES = 2000


def throughput(steps: int, heartbeat: bool) -> tuple[float, bool]:
    """(samples/s of one run's timed window, whether its record says the heartbeat ran)."""
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "r.jsonl")
        args = [
            *("--dataset", "synthetic", "--model", "cnn", "--batch-size", "64", "--threads", "1"),
            *("--max-steps", str(steps), "--timing-warmup-steps", "5", "--eval-every", "0"),
            *("--calibration-steps", "0", "--results", results),
            *([] if heartbeat else ["--no-heartbeat"]),
        ]
        subprocess.run(
            launch_command(RANKS, BACKEND, args),
            check=True,
            capture_output=True,
            env=launch_environment(),
            timeout=900,
        )
        with open(results) as handle:
            record = json.loads(handle.readline())
    return record["throughput"], record["tuning"]["heartbeat"]


def median_interval(ratios: list[float], seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of `ratios`."""
    draw = random.Random(seed)
    medians = sorted(statistics.median(draw.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP_SAMPLES))
    return medians[int(0.025 * BOOTSTRAP_SAMPLES)], medians[int(0.975 * BOOTSTRAP_SAMPLES) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8, help="interleaved (on, off) pairs")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (5 of them warm-up)")
    args = parser.parse_args()
    samples: dict[bool, list[float]] = {True: [], False: []}
    ratios = []
    for pair in range(args.pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        for heartbeat in order:
            value, recorded = throughput(args.steps, heartbeat)
            if recorded != heartbeat:
                raise SystemExit(f"the record's tuning says heartbeat={recorded}, but the run asked for {heartbeat}")
            samples[heartbeat].append(value)
            print(f"pair {pair + 1}: heartbeat {'on ' if heartbeat else 'off'} {value:8.0f} samples/s", flush=True)
        ratios.append(samples[True][-1] / samples[False][-1])
    low, high = median_interval(ratios)
    print(f"\n{BACKEND}, {RANKS} ranks x 1 thread, CNN, batch 64 per rank, {args.steps} steps, {args.pairs} pairs\n")
    print("| heartbeat | median samples/s |\n|---|---|")
    for heartbeat in (False, True):
        print(f"| {'on' if heartbeat else 'off'} | {statistics.median(samples[heartbeat]):.0f} |")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(
        f"\nratio on/off: median {statistics.median(ratios):.3f}, middle half {quartiles[0]:.3f} to "
        f"{quartiles[2]:.3f}, 95% interval of the median {low:.3f} to {high:.3f} (goal >= {GOAL})"
    )


if __name__ == "__main__":
    main()
