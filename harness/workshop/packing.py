"""Several ranks per device: does packing more processes onto a CPU or GPU raise throughput?

AccDP (HiPC 2022) found that small and medium models leave an A100 under-used, and that several
processes per GPU, run concurrently through NVIDIA's Multi-Process Service (MPS), raised the
throughput of one GPU. The CPU analogue is how a node's cores are split into ranks x threads.

`packings(cores, gpus)` lists the placements to compare on this node: on a CPU every power-of-two
split of the cores into ranks x threads, each rank pinned to cores of its own (`--pin-cores`, where
the system can pin), so that the ranks and their threads never trade cores; on GPUs 1, 2 and 4 ranks per GPU (`--procs-per-gpu`;
how ranks sharing a GPU reduce is their backend's business, see harness.backends).
`run_packing_study` trains each placement with `harness.run_sweep` (the same per-rank batch, so the
weak-scaling throughputs compare directly), inside `mps_daemon()` on GPUs when MPS can be started,
and tags each record with its placement and interleave round; `packing_rows` and `packing_table`
set them side by side, with 95% intervals over the rounds (harness.study.scaling.intervals).
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ..errors import UsageError
from ..process.discovery import cpu_cores
from ..process.environment import patched_environ

GPU_RANKS_PER_DEVICE = (1, 2, 4)
MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_VARIABLES = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
MPS_TIMEOUT_S = 30
PLACEMENT_TAG = "ranks_per_device"
REPEAT_TAG = "packing_repeat"
CAN_PIN = hasattr(os, "sched_setaffinity")  # Linux; macOS and Windows cannot pin a process to cores


@dataclass(frozen=True)
class Packing:
    """One placement of ranks on this node's devices."""

    ranks: int  # processes on the node
    threads: int  # torch threads per rank (CPU runs)
    ranks_per_device: int  # ranks per GPU, or ranks on the one CPU
    device: str  # "cpu" or "cuda"
    pin: bool = CAN_PIN  # CPU runs: each rank on cores of its own (--pin-cores), where the system can pin

    def label(self) -> str:
        if self.device == "cuda":
            return f"{self.ranks_per_device} rank(s) per GPU ({self.ranks} ranks)"
        return f"{self.ranks} rank(s) x {self.threads} thread(s)"

    def train_args(self) -> list[str]:
        """The `harness train` flags that make a run take this placement."""
        placement = (
            ["--procs-per-gpu", str(self.ranks_per_device)]
            if self.device == "cuda"
            else ["--threads", str(self.threads), *(["--pin-cores"] if self.pin else [])]
        )
        return [*placement, "--tag", f"{PLACEMENT_TAG}={self.ranks_per_device}"]


def packings(cores: Optional[int] = None, gpus: Optional[int] = None, max_ranks: int = 8) -> list[Packing]:
    """The placements to compare on a node with `cores` cores and `gpus` GPUs (default: this one's).

    GPUs: 1, 2 and 4 ranks per GPU on every GPU. CPU: 1, 2, 4, ... ranks (at most `max_ranks` and
    the cores) with the cores shared out evenly, so ranks x threads = cores."""
    cores = cores or cpu_cores()
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        return [
            Packing(gpus * per_gpu, max(1, cores // (gpus * per_gpu)), per_gpu, "cuda")
            for per_gpu in GPU_RANKS_PER_DEVICE
        ]
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
        started = subprocess.run(
            [control, "-d"], env=environment, capture_output=True, text=True, timeout=MPS_TIMEOUT_S
        )
        if started.returncode != 0:
            yield MpsState(
                False,
                f"{MPS_CONTROL} -d failed (exit {started.returncode}): "
                f"{(started.stderr or started.stdout).strip()[:200]}",
            )
            return
        try:
            with patched_environ(variables):
                yield MpsState(True, f"started for this study (pipes in {variables[MPS_VARIABLES[0]]})")
        finally:
            subprocess.run(
                [control], input="quit\n", env=environment, capture_output=True, text=True, timeout=MPS_TIMEOUT_S
            )


def run_packing_study(
    train_args: Sequence[str],
    results: str,
    plan: Optional[Sequence[Packing]] = None,
    backend: str = "ddp",
    repeats: int = 1,
    launcher: Optional[str] = None,
) -> dict[str, Any]:
    """Train every placement of `plan` (default: packings()) `repeats` times, interleaved (every
    placement once, then all again), each a one-run `harness.run_sweep` appending to `results`.
    Prints one line per run, numbered over the whole study. Returns {"records", "mps", "failed"}:
    the records in run order, the MpsState the runs had, the labels of runs that failed."""
    plan = list(plan or packings())
    if not plan:
        raise UsageError("no placements to compare; pass at least one Packing")
    if repeats < 1:
        raise UsageError(f"repeats must be a positive integer, got {repeats}")
    if any(flag in train_args for flag in ("--threads", "--procs-per-gpu", "--pin-cores")):
        raise UsageError(
            "a packing study sets --threads, --pin-cores and --procs-per-gpu per placement; drop them from train_args"
        )
    gpus = plan[0].ranks // plan[0].ranks_per_device if plan[0].device == "cuda" else 0
    records: list[dict[str, Any]] = []
    failed: list[str] = []
    total = repeats * len(plan)
    with mps_daemon(gpus) as mps:
        for repeat in range(repeats):
            for index, packing in enumerate(plan):
                label = f"{packing.label()}, repeat {repeat + 1}/{repeats}"
                args = [
                    *train_args,
                    *packing.train_args(),
                    "--tag",
                    f"mps={'on' if mps.running else 'off'}",
                    "--tag",
                    f"{REPEAT_TAG}={repeat}",
                ]
                result = _run_placement(
                    backend, packing, args, results, launcher, f"[{repeat * len(plan) + index + 1}/{total}] {label}"
                )
                records += result.records
                failed += [f"{label}: {failure}" for failure in result.failed]
    return {"records": records, "mps": mps, "failed": failed}


def _run_placement(
    backend: str, packing: Packing, train_args: list[str], results: str, launcher: Optional[str], progress: str
) -> Any:
    """One run of the study as a sweep of one run; its SweepResult.

    The line announcing the run is the study's: the sweep's own would number the run within its
    one-run sweep ("[1/1] ... repeat 1/1"), so it is left out."""
    from ..study.scaling.sweep import SweepSettings, plan_sweep, run_sweep

    settings = SweepSettings(
        backends=[backend],
        ranks=[packing.ranks],
        scaling="weak",
        results=results,
        launcher=launcher,
        train_args=train_args,
        repeats=1,
    )  # the study repeats, interleaved
    command = plan_sweep(settings)[0].command
    print(f"== {progress}: {shlex.join(command[:4])} ... {shlex.join(packing.train_args()[:2])}", flush=True)
    with contextlib.redirect_stdout(io.StringIO()):  # only the sweep's own progress line; runs print to the terminal
        return run_sweep(settings)


def _placement(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What tells placements apart: device, ranks, threads per rank and ranks per device."""
    per_device = int(record.get("tags", {}).get(PLACEMENT_TAG, record["world_size"]))
    return record.get("device"), record["world_size"], record.get("threads_per_rank"), per_device


def _rounds(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Interleave round (the study's repeat tag; the run's place among its placement's runs without
    one) -> the run's throughput: what harness.study.scaling.intervals pairs placements by."""
    return {str(run.get("tags", {}).get(REPEAT_TAG, index)): run["throughput"] for index, run in enumerate(runs)}


def _per_step_ms(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Milliseconds per step of one rank, per phase (harness.training.metrics.STEP_COLUMNS), mean over runs."""
    from ..process.phases import STEP_COLUMNS

    breakdowns = [run["step_breakdown"]["seconds_per_step"] for run in runs if run.get("step_breakdown")]
    if not breakdowns:
        return {}
    return {phase: 1000 * sum(b.get(phase, 0.0) for b in breakdowns) / len(breakdowns) for phase in STEP_COLUMNS}


def packing_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per placement, in the order the records first show it: its label, ranks, threads,
    ranks per device, runs, the throughput's mean over repeats with its 95% interval ("interval",
    harness.study.scaling.intervals.mean_interval; None below intervals.MIN_ROUNDS runs), the mean per rank, a rank's mean
    milliseconds per step in each phase ("per step ms"), and the speedup of the mean over the first
    row's with its 95% interval paired by interleave round ("speedup interval",
    intervals.ratio_interval; None for the first row or below intervals.MIN_ROUNDS shared rounds); "apart" says
    whether that interval leaves out 1, so that the difference is larger than the run-to-run spread
    (None where there is no interval); "records" holds the placement's runs, in the order given."""
    from ..study.scaling.intervals import mean_interval, overlap, ratio_interval

    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for record in records:
        if record.get("throughput"):
            groups.setdefault(_placement(record), []).append(record)
    rows: list[dict[str, Any]] = []
    for (device, ranks, threads, per_device), runs in groups.items():
        throughputs = [run["throughput"] for run in runs]
        mean = sum(throughputs) / len(throughputs)
        rows.append(
            {
                "placement": _placement_label(runs[0], per_device),
                "ranks per device": per_device,
                "ranks": ranks,
                "threads per rank": threads,
                "device": device,
                "runs": len(runs),
                "samples/s": mean,
                "interval": mean_interval(throughputs),
                "per rank": mean / ranks,
                "per step ms": _per_step_ms(runs),
                "mps": runs[0].get("tags", {}).get("mps"),
                "rounds": _rounds(runs),
                "records": runs,
            }
        )
    for row in rows:
        row["speedup"] = row["samples/s"] / rows[0]["samples/s"]
        row["speedup interval"] = None if row is rows[0] else ratio_interval(row["rounds"], rows[0]["rounds"])
        row["apart"] = None if row["speedup interval"] is None else not overlap(row["speedup interval"], (1.0, 1.0))
    return rows


def _placement_label(record: Mapping[str, Any], per_device: int) -> str:
    """How the figure and the verdict name a placement: as Packing.label() does."""
    if record.get("device") == "cuda":
        return f"{per_device} rank(s) per GPU ({record['world_size']} ranks)"
    return f"{record['world_size']} rank(s) x {record.get('threads_per_rank')} thread(s)"


def _interval_text(interval: Optional[tuple[float, float]], digits: int) -> str:
    return "-" if interval is None else f"[{interval[0]:,.{digits}f}, {interval[1]:,.{digits}f}]"


def packing_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Markdown of packing_rows: throughput and speedup as mean [95% interval] over repeats."""
    from ..study.scaling.report import markdown_table

    rows = packing_rows(records)
    keys = ("ranks per device", "ranks", "threads per rank", "device", "mps", "runs")
    columns = [(key, lambda row, key=key: row[key]) for key in keys]
    columns += [
        ("samples/s [95%]", lambda row: f"{row['samples/s']:,.0f} {_interval_text(row['interval'], 0)}"),
        ("per rank", lambda row: row["per rank"]),
        ("speedup [95%]", lambda row: f"{row['speedup']:.2f} {_interval_text(row['speedup interval'], 2)}"),
        ("interval leaves out 1", lambda row: None if row["apart"] is None else ("yes" if row["apart"] else "no")),
    ]
    return markdown_table(rows, columns)
