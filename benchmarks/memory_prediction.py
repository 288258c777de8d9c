"""Memory per rank, predicted against measured (issue: memory per rank predicted before the run):
every backend and option set (DDP, Horovod, DeepSpeed ZeRO 0-3, FSDP with and without
--fsdp-keep-gathered) at 2 ranks, on two model sizes of the images task, Adam.

Each run's record holds both (harness.training.memory): `memory.predicted`, made at the run's start
from the model, the backend's options and the activations its first micro-batch saved, and what the
run measured: the peak over the timed window (`peak_bytes_per_rank`: on a GPU the allocator's peak;
on the CPU the resident-set peak, which also holds the process itself, torch's libraries, so there
its error is not the rules') and the model state (`model_state_bytes_per_rank`: the live tensors a
rank keeps between steps). Printed per model and configuration: predicted and measured, in MiB per
rank (the highest rank), and the error, predicted / measured - 1. The issue's bar is the peak within
10% on a GPU.

Usage:
    .venv/bin/python benchmarks/memory_prediction.py [--models cnn,resnet18] [--device cpu|cuda]
        [--backends ddp,fsdp] [--batch-size 8] [--steps 2]
"""

from __future__ import annotations

import argparse

from harness.backends import BACKENDS
from harness.training.launch import launched_record

MIB = 2**20


def configurations(backends: list[str]) -> list[tuple[str, list[str]]]:
    """(backend, flags) of every option set that changes what a rank holds, for the backends named."""
    flags = {
        "ddp": [[]],
        "horovod": [[]],
        "deepspeed": [["--zero-stage", str(stage)] for stage in range(4)],
        "fsdp": [[], ["--fsdp-keep-gathered"]],
    }
    return [(backend, options) for backend in backends for options in flags[backend]]


def run(model: str, backend: str, flags: list[str], batch: int, steps: int, device: str) -> dict:
    """The record of one 2-rank run of `model` under `backend` with `flags`."""
    args = [
        *("--model", model, "--dataset", "synthetic", "--batch-size", str(batch), "--optimizer", "adam"),
        *("--max-steps", str(steps + 2), "--timing-warmup-steps", "2", "--eval-every", "0"),
        *("--calibration-steps", "0", "--threads", "1", "--device", device, "--no-heartbeat", *flags),
    ]
    return launched_record(2, backend, args, timeout=1800)


def row(model: str, backend: str, flags: list[str], record: dict) -> str:
    """One table row: predicted and measured peak and model state (the highest rank), and the errors."""
    memory = record["memory"]
    predicted = memory["predicted"]
    peak = max(memory["peak_bytes_per_rank"])
    state = max((memory["model_state_bytes_per_rank"] or {}).get("total") or [0])
    cells = [
        model,
        " ".join([backend, *flags]),
        f"{predicted['total_bytes'] / MIB:.1f}",
        f"{peak / MIB:.1f}",
        f"{predicted['total_bytes'] / peak - 1:+.1%}",
        f"{predicted['model_state_bytes'] / MIB:.1f}",
        f"{state / MIB:.1f}" if state else "-",
        f"{predicted['model_state_bytes'] / state - 1:+.1%}" if state else "-",
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,resnet18", help="images-task models, comma-separated")
    parser.add_argument(
        "--backends", default="ddp,horovod,deepspeed,fsdp", help="comma-separated: ddp, horovod, deepspeed, fsdp"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the two warm-up steps (2 or more)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a node with 2 GPUs")
    args = parser.parse_args()
    backends = [name for name in args.backends.split(",") if name]
    unknown = [name for name in backends if name not in BACKENDS or name == "none"]
    if unknown or args.steps < 2:
        parser.error(f"--backends takes ddp, horovod, deepspeed, fsdp (got {unknown}); --steps is 2 or more")
    print(
        "| model | configuration | predicted peak MiB | measured peak MiB | error | predicted state MiB "
        "| measured state MiB | error |"
    )
    print("|---" * 8 + "|")
    for model in (name for name in args.models.split(",") if name):
        for backend, flags in configurations(backends):
            record = run(model, backend, flags, args.batch_size, args.steps, args.device)
            print(row(model, backend, flags, record), flush=True)
    print(f"\nmemory: {record['memory']['source']} ({record['memory']['scope']})")


if __name__ == "__main__":
    main()
