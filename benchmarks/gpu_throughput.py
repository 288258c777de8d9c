"""GPU throughput: the harness against a bare hand-written loop on the same GPU, in one run.

1. ResNet-50 at 224x224 on synthetic data, channels-last, bf16 and fp16 autocast (fp16 with the
   harness's dynamic loss scaling), batch 256 per GPU, one rank per GPU: a bare PyTorch loop (data
   already on the GPU, the fastest a hand-written loop gets) against `harness train` under every
   backend. Goal: every backend >= 0.97 x the bare loop. The harness's data path (uint8 batches from
   host memory in loader workers, copied ahead on a side stream, normalised on the GPU) is part of
   what is measured.
2. The workshop CNN with K = 1, 2, 4 ranks sharing one GPU (`--procs-per-gpu K`, gloo for K > 1, as
   NCCL refuses two ranks on one GPU), under NVIDIA MPS when it can be started: does the AccDP gain
   (several processes per GPU for small models) appear?

Runs are interleaved (bare, none, ddp, horovod, deepspeed, bare, ...) and the figures are medians
over repeats, so the GPU's clocks and a shared node's noise hit every variant alike.

Reference: NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README (pytorch-21.03 NGC container,
DALI, batch 256 per GPU): 1x A100 80GB 2,470 img/s mixed precision, 938 img/s TF32.

Usage (on a GPU node; `make gpu-check` runs it):
    .venv/bin/python benchmarks/gpu_throughput.py [--repeats 3] [--steps 60] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from harness.backends.precision import Precision  # noqa: E402
from harness.errors import unknown_choice  # noqa: E402
from harness.process.launchers import launch_environment  # noqa: E402
from harness.training.launch import launch_command  # noqa: E402

BACKENDS = ("none", "ddp", "horovod", "deepspeed")
GOAL = 0.97
NVIDIA_REFERENCE = {
    "A100": "2,470 img/s mixed precision, 938 img/s TF32 (1x A100 80GB, batch 256, DALI; "
    "NVIDIA DeepLearningExamples ResNet50 v1.5 PyTorch README)"
}


def bare_loop(precision: str, batch: int, steps: int, warmup: int = 10) -> float:
    """Images/s of a hand-written ResNet-50 loop: data on the GPU, channels-last, autocast, SGD."""
    import torch.nn.functional as F
    import torchvision

    device = torch.device("cuda", 0)
    model = torchvision.models.resnet50(weights=None).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    setting = Precision.of(precision)
    scaler = setting.grad_scaler(device)
    images = torch.randn(batch, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, 1000, (batch,), device=device)
    for step in range(warmup + steps):
        if step == warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
        with setting.autocast(device):
            loss = F.cross_entropy(model(images), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start)


def harness_run(backend: str, ranks: int, flags: list[str]) -> float:
    """Throughput (samples/s over all ranks) of one `harness train` under the backend's launcher."""
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "r.jsonl")
        command = launch_command(ranks, backend, [*flags, "--results", results])
        finished = subprocess.run(command, capture_output=True, text=True, env=launch_environment(), timeout=1800)
        if finished.returncode != 0:
            raise SystemExit(f"failed: {' '.join(command)}\n{finished.stdout[-2000:]}\n{finished.stderr[-4000:]}")
        with open(results) as handle:
            return json.loads(handle.readline())["throughput"]


def _bare_in_subprocess(precision: str, batch: int, steps: int) -> float:
    # A fresh process per measurement, like the harness runs: no allocator or cuDNN state carried over.
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import gpu_throughput as g; "
        f"print(g.bare_loop({precision!r}, {batch}, {steps}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=1800, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def resnet50(precisions: list[str], batch: int, steps: int, repeats: int, workers: int, backends: list[str]) -> None:
    for precision in precisions:
        flags = [
            "--model",
            "resnet50",
            "--dataset",
            "synthetic",
            "--batch-size",
            str(batch),
            "--precision",
            precision,
            "--channels-last",
            "--max-steps",
            str(steps + 10),
            "--timing-warmup-steps",
            "10",
            "--num-workers",
            str(workers),
            "--eval-every",
            "0",
            "--calibration-steps",
            "0",
            "--lr",
            "0.01",
        ]
        samples: dict[str, list[float]] = {"bare loop": [], **{backend: [] for backend in backends}}
        for repeat in range(repeats):
            samples["bare loop"].append(_bare_in_subprocess(precision, batch, steps))
            for backend in backends:
                samples[backend].append(harness_run(backend, 1, flags))
            print(
                f"{precision} repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in samples.items()),
                flush=True,
            )
        median = {name: statistics.median(values) for name, values in samples.items()}
        print(
            f"\nResNet-50, 224x224 synthetic, channels-last, {precision}, batch {batch}, 1 rank on "
            f"{torch.cuda.get_device_name(0)}, median of {repeats} interleaved repeats, {steps} timed steps\n"
        )
        print("| variant | images/s | vs bare loop | goal |\n|---|---|---|---|")
        for name, value in median.items():
            goal = f">= {GOAL}" if name != "bare loop" else ""
            print(f"| {name} | {value:,.0f} | {value / median['bare loop']:.3f} | {goal} |")
        for gpu, reference in NVIDIA_REFERENCE.items():
            print(f"\nNVIDIA's published figure for {gpu}: {reference}")


def _start_mps(directory: str) -> Optional[str]:
    """Start NVIDIA MPS with per-run pipe and log directories; None and the reason printed if it cannot."""
    if not shutil.which("nvidia-cuda-mps-control"):
        print("MPS: nvidia-cuda-mps-control is not installed; running without MPS", flush=True)
        return None
    os.environ["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(directory, "pipe")
    os.environ["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(directory, "log")
    for name in ("pipe", "log"):
        os.makedirs(os.path.join(directory, name), exist_ok=True)
    started = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True)
    if started.returncode != 0:
        print(f"MPS: could not start ({started.stderr.strip() or started.returncode}); running without MPS")
        return None
    return directory


def _stop_mps() -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, capture_output=True)
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        os.environ.pop(name, None)


def ranks_per_gpu(procs: list[int], steps: int, repeats: int) -> None:
    flags = [
        "--model",
        "cnn",
        "--dataset",
        "synthetic",
        "--batch-size",
        "64",
        "--max-steps",
        str(steps + 10),
        "--timing-warmup-steps",
        "10",
        "--eval-every",
        "0",
        "--calibration-steps",
        "0",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        mps = _start_mps(tmp)
        try:
            samples: dict[int, list[float]] = {k: [] for k in procs}
            for _ in range(repeats):
                for k in procs:
                    samples[k].append(harness_run("ddp", k, [*flags, "--procs-per-gpu", str(k)]))
        finally:
            if mps:
                _stop_mps()
    base = statistics.median(samples[procs[0]])
    print(
        f"\nWorkshop CNN, batch 64 per rank, ddp, K ranks on one {torch.cuda.get_device_name(0)} "
        f"({'with' if mps else 'without'} MPS), median of {repeats}\n"
    )
    print("| ranks per GPU | communication | images/s | vs K=1 |\n|---|---|---|---|")
    for k in procs:
        value = statistics.median(samples[k])
        print(f"| {k} | {'NCCL' if k == 1 else 'gloo (CUDA tensors via host)'} | {value:,.0f} | {value / base:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--precisions", default="bf16,fp16")
    parser.add_argument("--workers", type=int, default=6, help="harness loader workers per rank")
    parser.add_argument("--procs-per-gpu", default="1,2,4")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="harness backends to compare with the bare loop"
    )
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    for backend in backends:
        if backend not in BACKENDS:
            parser.error(str(unknown_choice("backend", backend, BACKENDS)))
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU visible: run this on a GPU node (make gpu-check)")
    # An empty list skips that part, e.g. --procs-per-gpu "" for ResNet-50 alone.
    resnet50(
        [p for p in args.precisions.split(",") if p], args.batch, args.steps, args.repeats, args.workers, backends
    )
    procs = [int(k) for k in args.procs_per_gpu.split(",") if k]
    if procs:
        ranks_per_gpu(procs, args.steps, args.repeats)


if __name__ == "__main__":
    main()
