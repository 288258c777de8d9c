"""Memory and throughput of DDP, DeepSpeed ZeRO stages 0-3 and FSDP side by side, and whether they
all train the same weights (issue: FSDP as a fourth backend).

Every configuration trains the same model with Adam (two optimizer states per weight, the part
ZeRO-1 shards first) on 2 local ranks x 1 thread, synthetic data, the same seed; configurations are
interleaved per repeat. Printed per configuration: the model's state per rank as the record counts
it (`memory.model_state_bytes_per_rank`: weights, the parameters' gradients, the optimizer's state,
and the framework's other tensors, such as ZeRO's float32 partitions and buckets, each live storage
once), peak memory per rank as the record measures it (`memory`: on a
GPU the allocator's peak; on the CPU the process's resident-set peak, which also holds torch, the
data and the full model every rank builds before any sharding), throughput, and the weights'
largest difference from DDP's, relative to how far training moved them (parameters only:
batch-norm running statistics are per-rank buffers that DDP broadcasts from rank 0 and the sharded
backends do not).

On the CPU the runs use `--cpu-malloc system` with glibc's mmap threshold fixed at 64 KiB
(MALLOC_MMAP_THRESHOLD_): every block above it is its own mapping, handed back to the kernel when
freed, so the resident set follows the memory that is live. The harness's default (`reuse`) keeps
freed blocks in the process for the next step, and its peak would then hide what sharding frees.
DeepSpeed's ZeRO buckets are set to DDP's 25 MiB (--zero-bucket-mb) unless asked otherwise: its own
default, 5e8 elements, is a 1.9 GiB buffer that ZeRO-3 allocates whole, which would hide what
sharding saves (`--zero-bucket-mb none` shows it). A torch.empty buffer is counted in the model
state at its full size: on a GPU the allocator hands it out whole, while on the CPU its pages
become resident only when written.
Usage:
    .venv/bin/python benchmarks/sharding.py [--model resnet18] [--steps 4] [--repeats 1] [--zero-bucket-mb 25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile

import torch

from harness.data.builtin import synthetic_shape
from harness.process.launchers import launch_environment
from harness.study.scaling.equivalence import update_differences, worst
from harness.tasks.models import build_model
from harness.training.launch import launch_command
from harness.training.memory import MODEL_STATE

MIB = 2**20
MMAP_THRESHOLD_BYTES = 64 * 1024


def configurations(zero_flags: list[str]) -> list[tuple[str, str, list[str]]]:
    """(label, backend, its flags); DDP first: the weights every other row is compared with.
    `zero_flags` join every ZeRO stage's flags (the bucket size)."""
    return [
        ("ddp", "ddp", []),
        *((f"deepspeed ZeRO-{stage}", "deepspeed", ["--zero-stage", str(stage), *zero_flags]) for stage in range(4)),
        ("fsdp", "fsdp", []),
    ]


def train(backend: str, flags: list[str], model: str, steps: int, out: str) -> dict:
    """The record of one 2-rank run, which saves its weights to `out`.pt."""
    args = [
        "--model",
        model,
        "--dataset",
        "synthetic",
        "--batch-size",
        "2",
        "--threads",
        "1",
        "--optimizer",
        "adam",
        "--lr",
        "0.001",
        "--seed",
        "0",
        "--max-steps",
        str(steps + 2),
        "--timing-warmup-steps",
        "2",
        "--eval-every",
        "0",
        "--calibration-steps",
        "0",
        "--results",
        f"{out}.jsonl",
        "--save-model",
        f"{out}.pt",
        "--cpu-malloc",
        "system",
        *flags,
    ]
    environment = launch_environment({"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES)})
    done = subprocess.run(
        launch_command(2, backend, args), capture_output=True, text=True, env=environment, timeout=1800
    )
    if done.returncode:
        raise SystemExit(f"{backend} {' '.join(flags)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    with open(f"{out}.jsonl") as handle:
        return json.loads(handle.readline())


def parameter_difference(weights: dict, reference: dict, initial: dict) -> float:
    names = [name for name, _ in initial.items() if not name.endswith(("running_mean", "running_var", "tracked"))]
    pick = lambda state: {name: state[name] for name in names}  # noqa: E731
    return worst(update_differences(pick(weights), pick(reference), pick(initial)))[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18", help="cnn, resnet18 or resnet50")
    parser.add_argument(
        "--steps",
        type=int,
        default=4,
        help="timed steps per run (after two warm-up steps: the model state is counted in the second)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats of every configuration")
    parser.add_argument(
        "--zero-bucket-mb",
        default="25",
        help="DeepSpeed's ZeRO bucket size in MiB (DDP's default bucket), or `none` for DeepSpeed's own 5e8 elements",
    )
    args = parser.parse_args()
    if args.steps < 2:  # the harness gives timing at most half a run's steps to warm up
        parser.error(f"--steps must be 2 or more (the two warm-up steps need as many timed ones), got {args.steps}")
    buckets = [] if args.zero_bucket_mb == "none" else ["--zero-bucket-mb", args.zero_bucket_mb]
    runs = configurations(buckets)
    peaks: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    states: dict[str, dict[str, list[int]]] = {}
    speeds: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    differences: dict[str, float] = {}
    torch.manual_seed(0)  # the seed of the runs: the weights they start from
    (channels, size, _), classes = synthetic_shape(args.model)
    initial = build_model(args.model, channels, size, classes, None).state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for label, backend, flags in runs:
                record = train(backend, flags, args.model, args.steps, os.path.join(tmp, f"{repeat}-{label}"))
                peaks[label].append(max(record["memory"]["peak_bytes_per_rank"]) / MIB)
                states[label] = record["memory"]["model_state_bytes_per_rank"]  # the same in every repeat
                speeds[label].append(record["throughput"])
                weights = torch.load(os.path.join(tmp, f"{repeat}-{label}.pt"), weights_only=True)
                reference = torch.load(os.path.join(tmp, f"{repeat}-ddp.pt"), weights_only=True)
                differences[label] = max(
                    differences.get(label, 0.0), parameter_difference(weights, reference, initial)
                )
                print(
                    f"repeat {repeat + 1}: {label:18s} {peaks[label][-1]:8.0f} MiB {speeds[label][-1]:7.1f} samples/s",
                    flush=True,
                )
        source = record["memory"]["source"]
    print(
        f"\n{args.model}, Adam, 2 ranks x batch 2, {args.steps} timed steps, {args.repeats} interleaved repeat(s); "
        f"memory: {source}; DeepSpeed's ZeRO buckets: {' '.join(buckets) or 'its default'}\n"
    )
    parts = [*MODEL_STATE, "total"]
    print(
        "| configuration | "
        + " | ".join(f"{part} (MiB per rank)" for part in parts)
        + " | peak memory per rank (MiB, highest rank) | samples/s | weights vs DDP (of the update) |"
    )
    print("|---" * (len(parts) + 4) + "|")
    for label, _, _ in runs:
        state = " | ".join(f"{max(states[label][part]) / MIB:.1f}" for part in parts)
        print(
            f"| {label} | {state} | {statistics.mean(peaks[label]):.0f} | {statistics.mean(speeds[label]):.2f} | "
            f"{differences[label]:.2e} |"
        )


if __name__ == "__main__":
    main()
