"""What the heartbeat costs: throughput with it on (the default) and off (--no-heartbeat), side by side.

DDP, 2 ranks x 1 thread under torchrun, the workshop CNN, batch 64 per rank on synthetic data. The
two variants run in interleaved pairs whose order alternates (on, off; off, on; ...), so that the
machine's drift hits both alike; each pair gives one ratio (on / off), and the table shows the
median ratio with the range of the middle ratios and a 95% bootstrap interval of the median. The
goal (harness.process.heartbeat) is a ratio >= 0.99.

Whole runs on a loaded machine vary by far more than 1%, so the table also gives what the heartbeat
adds to one step, measured in this process: the loop's calls of a step (one per phase) with the
heartbeat on, sending to a real store, against the same calls with it off; the best of several
interleaved rounds (the least disturbed). That time over the runs' step time bounds the cost.
Usage:
    .venv/bin/python benchmarks/heartbeat.py [--pairs 8] [--steps 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from harness.process import phases as phase
from harness.process.discovery import ClusterEnv
from harness.process.heartbeat import Heartbeat
from harness.training.launch import launched_record

BACKEND, RANKS = "ddp", 2
GOAL = 0.99
BOOTSTRAP_SAMPLES = 2000
STEP_PHASES = (phase.DATA, phase.FORWARD, phase.BACKWARD, phase.GRADIENT_SYNC, phase.OPTIMIZER)
GLOBAL_BATCH = 64 * RANKS


def throughput(steps: int, heartbeat: bool) -> tuple[float, bool]:
    """(samples/s of one run's timed window, whether its record says the heartbeat ran)."""
    args = [
        *("--dataset", "synthetic", "--model", "cnn", "--batch-size", "64", "--threads", "1"),
        *("--max-steps", str(steps), "--timing-warmup-steps", "5", "--eval-every", "0"),
        *("--calibration-steps", "0"),
        *([] if heartbeat else ["--no-heartbeat"]),
    ]
    record = launched_record(RANKS, BACKEND, args)
    return record["throughput"], record["tuning"]["heartbeat"]


def seconds_per_step_added(steps: int = 20000, rounds: int = 7) -> float:
    """What the heartbeat adds to one step's calls (best of `rounds`), on and off measured in turn."""
    on = Heartbeat.start(ClusterEnv(0, RANKS, 0, RANKS, "127.0.0.1", 0, "none"), enabled=True)
    on.connect(lambda ports: ports, "cpu")  # rank 0 of RANKS: the sum over ranks is its own ports
    off = Heartbeat()
    best: dict[bool, float] = {True: float("inf"), False: float("inf")}
    try:
        for _ in range(rounds):
            for enabled, beats in ((True, on), (False, off)):
                started = time.perf_counter()
                for step in range(1, steps + 1):
                    for name in STEP_PHASES:
                        beats.beat(step, name.label)
                    beats.beat(step, phase.VOTE.label)
                best[enabled] = min(best[enabled], (time.perf_counter() - started) / steps)
    finally:
        on.stop()
    return best[True] - best[False]


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
    added = seconds_per_step_added()
    step_seconds = GLOBAL_BATCH / statistics.median(samples[False])
    print(
        f"\nadded per step: {added * 1e6:.1f} us, {added / step_seconds:.5%} of the runs' {step_seconds * 1e3:.0f} ms "
        f"step (bound on the ratio: {1 - added / step_seconds:.5f})"
    )
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(
        f"\nratio on/off: median {statistics.median(ratios):.3f}, middle half {quartiles[0]:.3f} to "
        f"{quartiles[2]:.3f}, 95% interval of the median {low:.3f} to {high:.3f} (goal >= {GOAL})"
    )


if __name__ == "__main__":
    main()
