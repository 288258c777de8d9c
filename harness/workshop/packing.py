"""Several ranks per device: does packing more processes onto a CPU or GPU raise throughput?

AccDP (HiPC 2022) found small and medium models leave an A100 under-used (43%), and several
processes per GPU, run concurrently through NVIDIA's Multi-Process Service (MPS), gave up to 58%
more throughput on one GPU. The CPU analogue is how a node's cores are split into ranks x threads.

`packings(cores, gpus)` lists the placements to compare on this node: on a CPU every power-of-two
split of the cores into ranks x threads; on GPUs 1, 2 and 4 ranks per GPU (`--procs-per-gpu`;
ranks sharing a GPU reduce through gloo, since NCCL refuses two ranks on one GPU).
`run_packing_study` trains each placement with `harness.run_sweep` (the same per-rank batch, so the
weak-scaling throughputs compare directly), inside `mps_daemon()` on GPUs when MPS can be started,
and tags each record with its placement; `packing_table` sets them side by side.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from ..process.discovery import cpu_cores
from ..errors import UsageError

GPU_RANKS_PER_DEVICE = (1, 2, 4)
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
MPS_TIMEOUT_S = 30
PLACEMENT_TAG = "ranks_per_device"


@dataclass(frozen=True)
class Packing:
    """One placement of ranks on this node's devices."""

    ranks: int  # processes on the node
    threads: int  # torch threads per rank (CPU runs)
    ranks_per_device: int  # ranks per GPU, or ranks on the one CPU
    device: str  # "cpu" or "cuda"

    def label(self) -> str:
        if self.device == "cuda":
            return f"{self.ranks_per_device} rank(s) per GPU ({self.ranks} ranks)"
        return f"{self.ranks} rank(s) x {self.threads} thread(s)"

    def train_args(self) -> List[str]:
        """The `harness train` flags that make a run take this placement."""
        placement = (["--procs-per-gpu", str(self.ranks_per_device)] if self.device == "cuda"
                     else ["--threads", str(self.threads)])
        return [*placement, "--tag", f"{PLACEMENT_TAG}={self.ranks_per_device}"]


def packings(cores: Optional[int] = None, gpus: Optional[int] = None, max_ranks: int = 8) -> List[Packing]:
    """The placements to compare on a node with `cores` cores and `gpus` GPUs (default: this one's).

    GPUs: 1, 2 and 4 ranks per GPU on every GPU. CPU: 1, 2, 4, ... ranks (at most `max_ranks` and
    the cores) with the cores shared out evenly, so ranks x threads = cores."""
    cores = cores or cpu_cores()
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        return [Packing(gpus * per_gpu, max(1, cores // (gpus * per_gpu)), per_gpu, "cuda")
                for per_gpu in GPU_RANKS_PER_DEVICE]
    found, ranks = [], 1
    while ranks <= min(cores, max_ranks):
        found.append(Packing(ranks, cores // ranks, ranks, "cpu"))
        ranks *= 2
    return found


@dataclass(frozen=True)
class MpsState:
    """Whether the runs of a packing study share GPUs through MPS, and why (not)."""

    running: bool
    reason: str


@contextlib.contextmanager
def mps_daemon(gpus: int, control: Optional[str] = None) -> Iterator[MpsState]:
    """NVIDIA MPS for the duration of the block, where it can be had.

    A daemon that the site already runs (CUDA_MPS_PIPE_DIRECTORY set) is used as it is. Otherwise
    one is started with its pipe and log directories in a private temporary directory (so it never
    meets another user's daemon), their variables are set in this process's environment for the
    runs it launches, and it is told to quit at the end. Without GPUs or without the control
    program, nothing is started and the state says why."""
    if gpus == 0:
        yield MpsState(False, "no GPU: MPS is a GPU feature")
        return
    if os.environ.get(MPS_VARIABLES[0]):
        yield MpsState(True, f"the site's MPS daemon ({MPS_VARIABLES[0]}={os.environ[MPS_VARIABLES[0]]})")
        return
    control = control or shutil.which(MPS_CONTROL)
    if control is None:
        yield MpsState(False, f"{MPS_CONTROL} is not installed on this node")
        return
    with tempfile.TemporaryDirectory(prefix="harness-mps-") as directory:
        variables = {name: os.path.join(directory, name.split("_")[-2].lower()) for name in MPS_VARIABLES}
        for path in variables.values():
            os.makedirs(path)
        environment = {**os.environ, **variables}
        started = subprocess.run([control, "-d"], env=environment, capture_output=True, text=True,
                                 timeout=MPS_TIMEOUT_S)
        if started.returncode != 0:
            yield MpsState(False, f"{MPS_CONTROL} -d failed (exit {started.returncode}): "
                                  f"{(started.stderr or started.stdout).strip()[:200]}")
            return
        previous = {name: os.environ.get(name) for name in variables}
        os.environ.update(variables)
        try:
            yield MpsState(True, f"started for this study (pipes in {variables[MPS_VARIABLES[0]]})")
        finally:
            for name, value in previous.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            subprocess.run([control], input="quit\n", env=environment, capture_output=True, text=True,
                           timeout=MPS_TIMEOUT_S)


def run_packing_study(train_args: Sequence[str], results: str, plan: Optional[Sequence[Packing]] = None,
                      backend: str = "ddp", repeats: int = 1, launcher: Optional[str] = None) -> Dict[str, Any]:
    """Train every placement of `plan` (default: packings()) `repeats` times, interleaved, each a
    one-run `harness.run_sweep` appending to `results`. Returns {"records", "mps", "failed"}:
    the records in run order, the MpsState the runs had, the labels of runs that failed."""
    from ..study.sweep import SweepSettings, run_sweep

    plan = list(plan or packings())
    if not plan:
        raise UsageError("no placements to compare; pass at least one Packing")
    if any(flag in train_args for flag in ("--threads", "--procs-per-gpu")):
        raise UsageError("a packing study sets --threads and --procs-per-gpu per placement; drop them from train_args")
    gpus = plan[0].ranks // plan[0].ranks_per_device if plan[0].device == "cuda" else 0
    records: List[Dict[str, Any]] = []
    failed: List[str] = []
    with mps_daemon(gpus) as mps:
        for repeat in range(repeats):
            for packing in plan:
                result = run_sweep(SweepSettings(
                    backends=[backend], ranks=[packing.ranks], scaling="weak", results=results, launcher=launcher,
                    train_args=[*train_args, *packing.train_args(), "--tag", f"mps={'on' if mps.running else 'off'}",
                                "--tag", f"packing_repeat={repeat}"]))
                records += result.records
                failed += [f"{packing.label()}: {failure}" for failure in result.failed]
    return {"records": records, "mps": mps, "failed": failed}


def _placement(record: Mapping[str, Any]) -> int:
    return int(record.get("tags", {}).get(PLACEMENT_TAG, record["world_size"]))


def packing_rows(records: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """One row per placement (mean over repeats): ranks, threads, ranks per device, throughput,
    and the speedup over the placement with the fewest ranks per device."""
    groups: Dict[int, List[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("throughput"):
            groups.setdefault(_placement(record), []).append(record)
    rows = []
    for per_device in sorted(groups):
        runs = groups[per_device]
        throughput = sum(run["throughput"] for run in runs) / len(runs)
        rows.append({"ranks per device": per_device, "ranks": runs[0]["world_size"],
                     "threads per rank": runs[0].get("threads_per_rank"), "device": runs[0].get("device"),
                     "runs": len(runs), "samples/s": throughput, "per rank": throughput / runs[0]["world_size"],
                     "mps": runs[0].get("tags", {}).get("mps")})
    for row in rows:
        row["speedup"] = row["samples/s"] / rows[0]["samples/s"]
    return rows


def packing_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown of packing_rows."""
    from ..study.report import markdown_table

    rows = packing_rows(records)
    keys = ("ranks per device", "ranks", "threads per rank", "device", "mps", "runs", "samples/s", "per rank",
            "speedup")
    return markdown_table(rows, [(key, lambda row, key=key: row[key]) for key in keys])
