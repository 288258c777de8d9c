"""Reliability figures (issue: checkpoint, preemption, failing ranks), measured in one run.

1. One checkpoint of ResNet-18 (11.7 M parameters, 1000 classes, SGD momentum state) through
   harness.training.checkpoint on the single-process backend: bytes on disk; seconds to write it (torch.save
   into the partial directory, fsync, sha256 of every file for the manifest, rename), to verify it
   (sha256 again, as --resume does) and to load it. Medians of --repeats.
2. The per-step preemption check (one allreduce of one number, overlapped with the next step) next
   to a training step of the workshop CNN (batch 64, 1 thread per rank) at 2 ranks: blocks of
   steps with and without the check, interleaved in pairs, under torch.distributed/gloo (the ddp
   and deepspeed backends) and Horovod; the median of the pairs' time ratios.
3. Seconds from the SIGKILL of rank 1 (of 2) to the exit of the whole job, per backend under its
   own launcher (--timeout 20); with --hung also from a SIGSTOP of rank 1 (a hung rank or lost
   node: nothing closes its sockets, so only --timeout ends the wait).

Usage: .venv/bin/python benchmarks/checkpoint.py [--repeats 3] [--skip-failures] [--hung]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from harness.backends import get_backend  # noqa: E402
from harness.config import TrainConfig  # noqa: E402
from harness.process.discovery import ClusterEnv, detect_cluster  # noqa: E402
from harness.process.launchers import launch_environment, launcher_command  # noqa: E402
from harness.process.preemption import PreemptionWatcher  # noqa: E402
from harness.process.processes import processes_with_command  # noqa: E402
from harness.tasks.models import build_model  # noqa: E402
from harness.training.checkpoint import Checkpointer, Progress, RunLayout, restore  # noqa: E402
from harness.training.launch import launch_command  # noqa: E402
from harness.training.plan import optimizer_factory  # noqa: E402
from harness.training.resume import verify_checkpoint  # noqa: E402

TIMEOUT_S = 20
FAILURE_ARGS = [
    "--model",
    "cnn",
    "--dataset",
    "digits",
    "--batch-size",
    "64",
    "--epochs",
    "20",
    "--threads",
    "1",
    "--eval-every",
    "0",
    "--calibration-steps",
    "0",
    "--timeout",
    str(TIMEOUT_S),
]


def resnet18_checkpoint(repeats: int, directory: str) -> dict[str, float]:
    """Size and times of one ResNet-18 checkpoint written, verified and loaded by the harness."""
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    config = TrainConfig(task_args={"model": "resnet18"}, checkpoint_dir=directory, keep_checkpoints=1)
    backend = get_backend("none")
    model, optimizer = backend.wrap(build_model("resnet18", 3, 64, 1000, None), optimizer_factory(config), 2)
    F.cross_entropy(model(torch.randn(2, 3, 64, 64)), torch.tensor([1, 2])).backward()
    optimizer.step()  # the momentum buffers exist, as in any checkpoint after step 1
    cluster = ClusterEnv(0, 1, 0, 1, "127.0.0.1", 29500, "none")
    layout = RunLayout(1, 64, 1_281_167, 20_018, 20_018 * 90)  # ImageNet-sized run facts, for the manifest
    checkpointer = Checkpointer(config, cluster, backend, layout)
    times: dict[str, list[float]] = {"write_s": [], "verify_s": [], "load_s": []}
    size = 0
    for repeat in range(repeats):
        times["write_s"].append(
            checkpointer.save(repeat + 1, Progress(), torch.zeros(2, dtype=torch.float64), "bench")
        )
        started = time.perf_counter()
        checkpoint = verify_checkpoint(checkpointer.last_path)
        times["verify_s"].append(time.perf_counter() - started)
        started = time.perf_counter()
        restore(checkpoint, backend, cluster, torch.device("cpu"))
        times["load_s"].append(time.perf_counter() - started)
        size = sum(entry["bytes"] for entry in checkpoint.manifest["files"].values())
    parameters = sum(p.numel() for p in model.parameters())
    return {"parameters": parameters, "bytes": size, **{key: statistics.median(v) for key, v in times.items()}}


def check_worker(backend_name: str, blocks: int, steps: int) -> None:
    """Inside a 2-rank job: CNN steps without and with the preemption check, in alternating blocks."""
    torch.set_num_threads(1)
    cluster, device = detect_cluster(), torch.device("cpu")
    config = TrainConfig(backend=backend_name, threads=1)
    backend = get_backend(backend_name)
    backend.init(cluster, device)
    torch.manual_seed(0)
    model, optimizer = backend.wrap(build_model("cnn", 1, 28, 10, None), optimizer_factory(config), 64)
    watcher = PreemptionWatcher()
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    seconds: dict[bool, list[float]] = {False: [], True: []}
    check_alone: list[float] = []
    for block in range(blocks + 1):  # block 0 warms up
        for check in (False, True):
            backend.barrier()
            started = time.perf_counter()
            for step in range(steps):
                backend.backward(F.cross_entropy(model(images), labels))
                backend.finish_gradient_sync()
                backend.step()
                if check:
                    watcher.stop_agreed(step, cluster.rank, backend, device)
            watcher.settle()  # no collective may be left in flight
            backend.barrier()
            if block:
                seconds[check].append((time.perf_counter() - started) / steps)
        backend.barrier()
        started = time.perf_counter()
        for step in range(steps):
            watcher.stop_agreed(step, cluster.rank, backend, device)
        watcher.settle()
        if block:
            check_alone.append((time.perf_counter() - started) / steps)
    if cluster.is_main:
        # Adjacent blocks form pairs, so drifting machine load cancels out of each pair's ratio.
        ratios = [with_check / without for without, with_check in zip(seconds[False], seconds[True])]
        print(
            json.dumps(
                {
                    "step_s": statistics.median(seconds[False]),
                    "step_with_check_s": statistics.median(seconds[True]),
                    "ratio": statistics.median(ratios),
                    "check_alone_s": statistics.median(check_alone),
                }
            ),
            flush=True,
        )
    backend.shutdown()


def preemption_check_cost(blocks: int, steps: int) -> dict[str, dict[str, float]]:
    worker = [os.path.abspath(__file__), "--check-worker"]
    commands = {
        "torch.distributed (ddp, deepspeed)": launcher_command("torchrun", 2, [*worker, "ddp"]),
        "horovod": launcher_command("horovodrun", 2, [*worker, "horovod"]),
    }
    figures = {}
    for name, command in commands.items():
        out = subprocess.run(
            [*command, "--blocks", str(blocks), "--steps", str(steps)],
            capture_output=True,
            text=True,
            env=launch_environment(),
            timeout=900,
            cwd=REPO,
        )
        lines = [line.split(">:", 1)[-1] for line in out.stdout.splitlines() if "{" in line]
        if out.returncode or not lines:
            raise SystemExit(f"failed: {' '.join(command)}\n{out.stderr[-3000:]}")
        figures[name] = json.loads(lines[-1][lines[-1].index("{") :])
    return figures


def kill_to_exit(backend: str, signal_name: str, workdir: str) -> dict[str, object]:
    """Seconds from rank 1 sending itself `signal_name` after step 5 to the survivor's message and
    to the exit of the job."""
    from tests.helpers.checkpoint_helpers import time_job

    marker_dir = tempfile.mkdtemp(dir=workdir)  # in every rank's command line, to find leftovers
    command = launch_command(2, backend, [*FAILURE_ARGS, "--results", os.path.join(marker_dir, "r.jsonl")])
    signalled, lost = f"sending SIG{signal_name} to itself", "lost contact with a peer"
    job = time_job(command, {"HARNESS_TEST_SIGNAL": f"{signal_name}@5:1"}, [signalled, lost], limit=600)
    leftovers = processes_with_command(marker_dir)
    for pid in leftovers:  # a stopped rank the launcher did not end
        os.kill(pid, signal.SIGKILL)
    return {
        "exit_s": job.seconds(signalled),
        "message_s": job.seconds(signalled, lost),
        "status": job.returncode,
        "ranks_left_running": len(leftovers),
    }


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=20, help="blocks per variant in the preemption-check timing")
    parser.add_argument("--steps", type=int, default=10, help="steps per block")
    parser.add_argument("--dir", default=None, help="where to write the ResNet-18 checkpoints (default: a temp dir)")
    parser.add_argument("--skip-failures", action="store_true", help="leave out the kill-to-exit measurements")
    parser.add_argument("--hung", action="store_true", help="also time a SIGSTOPped (hung) rank")
    parser.add_argument("--check-worker", metavar="BACKEND", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check_worker:
        check_worker(args.check_worker, args.blocks, args.steps)
        return

    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        figures = resnet18_checkpoint(args.repeats, os.path.join(directory, "checkpoints"))
    print(
        f"ResNet-18 checkpoint ({figures['parameters'] / 1e6:.1f} M parameters, SGD momentum): "
        f"{figures['bytes'] / 2**20:.1f} MiB; write {figures['write_s']:.2f} s, verify {figures['verify_s']:.2f} s, "
        f"load {figures['load_s']:.2f} s (median of {args.repeats})",
        flush=True,
    )

    for name, cost in preemption_check_cost(args.blocks, args.steps).items():
        print(
            f"preemption check, {name}: {1e3 * cost['check_alone_s']:.3f} ms alone; CNN step "
            f"{1e3 * cost['step_s']:.1f} ms without, {1e3 * cost['step_with_check_s']:.1f} ms with "
            f"(median ratio of paired blocks {cost['ratio']:.3f})",
            flush=True,
        )

    if args.skip_failures:
        return
    with tempfile.TemporaryDirectory() as workdir:
        for signal_name in ("KILL", "STOP") if args.hung else ("KILL",):
            for backend in ("ddp", "horovod", "deepspeed"):
                result = kill_to_exit(backend, signal_name, workdir)
                print(
                    f"SIG{signal_name} of rank 1, {backend}: survivor's message after {_seconds(result['message_s'])}, "
                    f"job exited after {_seconds(result['exit_s'])} (status {result['status']}, ranks left "
                    f"running: {result['ranks_left_running']}; --timeout {TIMEOUT_S})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
