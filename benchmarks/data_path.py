"""Is the data path ever the bottleneck? MNIST from prepared files vs synthetic data, side by side.

Writes MNIST-format IDX files (60,000 + 10,000 random 28x28 images) into a temporary directory,
prepares them once with `harness data prepare`, then trains the CNN with batch 64 on 2 DDP ranks
(torchrun, gloo) on `mnist` and on `synthetic` (no files, a small in-memory pool), the same number
of steps, runs interleaved (mnist, synthetic, synthetic, mnist, ...) so machine noise hits both
alike. Prints each run, then medians: accelerator utilisation (`au` = compute / (compute + data
wait)) and the throughput ratio mnist / synthetic of each repeat's pair of runs. Goals: au >= 0.95,
ratio >= 0.95. Usage:
    .venv/bin/python benchmarks/data_path.py [--repeats 3] [--steps 200] [--num-workers 0]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from harness.process.launchers import launch_environment
from harness.training.launch import launch_command

TRAIN_IMAGES, TEST_IMAGES = 60_000, 10_000


def write_idx(path: str, array: np.ndarray) -> None:
    """An IDX file of unsigned bytes (the MNIST format)."""
    with open(path, "wb") as handle:
        handle.write(bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes())
        handle.write(array.tobytes())


def write_mnist(data_dir: str) -> None:
    raw = os.path.join(data_dir, "MNIST", "raw")
    os.makedirs(raw)
    rng = np.random.default_rng(0)
    for prefix, count in (("train", TRAIN_IMAGES), ("t10k", TEST_IMAGES)):
        write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte"), rng.integers(0, 256, (count, 28, 28), np.uint8))
        write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"), rng.integers(0, 10, count, np.uint8))


def train_record(dataset: str, data_dir: str, steps: int, num_workers: int, results: str) -> dict:
    args = [
        "--dataset",
        dataset,
        "--data-dir",
        data_dir,
        "--model",
        "cnn",
        "--batch-size",
        "64",
        "--threads",
        "1",
        "--max-steps",
        str(steps + 5),
        "--timing-warmup-steps",
        "5",
        "--num-workers",
        str(num_workers),
        "--eval-every",
        "0",
        "--results",
        results,
    ]
    out = subprocess.run(
        launch_command(2, "ddp", args, "torchrun"),
        capture_output=True,
        text=True,
        env=launch_environment(),
        timeout=900,
    )
    if out.returncode:
        raise SystemExit(f"{dataset} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    with open(results) as handle:
        return json.loads(handle.readlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per run (plus 5 warmup)")
    parser.add_argument("--num-workers", type=int, default=0, help="loader workers per rank for both datasets")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, results = os.path.join(tmp, "data"), os.path.join(tmp, "results.jsonl")
        started = time.perf_counter()
        write_mnist(data_dir)
        written = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "harness", "data", "prepare", "mnist", "--data-dir", data_dir],
            check=True,
            capture_output=True,
            env=launch_environment(),
            timeout=600,
        )
        print(
            f"wrote {TRAIN_IMAGES:,} + {TEST_IMAGES:,} IDX images in {written - started:.1f} s, "
            f"prepared them in {time.perf_counter() - written:.1f} s (including interpreter start-up)",
            flush=True,
        )
        samples: dict[str, list[dict]] = {"mnist": [], "synthetic": []}
        for repeat in range(args.repeats):
            # Alternate which goes first, so a trend in the machine's load favours neither.
            for dataset in ("mnist", "synthetic") if repeat % 2 == 0 else ("synthetic", "mnist"):
                record = train_record(dataset, data_dir, args.steps, args.num_workers, results)
                samples[dataset].append(record)
                print(
                    f"repeat {repeat + 1}: {dataset:9s} {record['throughput']:7.0f} samples/s  au {record['au']:.4f}",
                    flush=True,
                )
    median = {
        dataset: {key: statistics.median(r[key] for r in records) for key in ("throughput", "au")}
        for dataset, records in samples.items()
    }
    # The ratio of each repeat's adjacent pair of runs cancels slow drifts in load; report its median.
    ratio = statistics.median(
        m["throughput"] / s["throughput"] for m, s in zip(samples["mnist"], samples["synthetic"])
    )
    print(
        f"\nCNN, batch 64 per rank, 2 DDP ranks x 1 thread (torchrun, gloo), --num-workers {args.num_workers}, "
        f"{args.steps} timed steps, median of {args.repeats} interleaved repeats\n"
    )
    print("| data | samples/s (median) | au (median) | throughput ratio to synthetic (median of pairs) | goal |")
    print("|---|---|---|---|---|")
    print(f"| synthetic | {median['synthetic']['throughput']:.0f} | {median['synthetic']['au']:.4f} | 1.000 | |")
    print(
        f"| mnist (prepared, memory-mapped) | {median['mnist']['throughput']:.0f} | {median['mnist']['au']:.4f} | "
        f"{ratio:.3f} | au >= 0.95, ratio >= 0.95 |"
    )
    met = median["mnist"]["au"] >= 0.95 and ratio >= 0.95
    print(f"\ngoals {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
