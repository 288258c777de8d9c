"""A job study's settings: NAME=VALUE variables (qsub -v, sbatch's environment) over the site's
defaults, resolved against the allocation into one checked `StudySettings`.

    BACKENDS            backends to compare (default: the site's; lists take spaces or commas)
    NODES | RANKS       node counts (x RANKS_PER_NODE) or total rank counts; default powers of two
                        up to the allocation, by nodes on GPU sites and by ranks on CPU sites
    RANKS_PER_NODE      default GPUS_PER_NODE x PROCS_PER_GPU, or the allocation's tasks per node
    GPUS_PER_NODE       default: the node's GPUs (harness.process.accelerator; 0 on a CPU node)
    PROCS_PER_GPU       K > 1: K ranks per GPU under NVIDIA MPS
    SCALING REPEATS     weak | strong; runs per configuration, interleaved
    TASK                what the runs train: images (the built-in task, the default), MODULE:FUNCTION
                        or path/to/file.py:FUNCTION returning a harness.Task (a relative path is read
                        from the kit, as a module is imported from it: the job's PYTHONPATH)
    TASK_ARGS           the task's arguments: KEY=VALUE words (VALUE read as JSON where it is JSON)
    MODEL DATASET DATA_DIR   the images task's arguments (refused beside another TASK)
    BATCH_SIZE GLOBAL_BATCH EPOCHS STEPS PRECISION CHECKPOINT_EVERY TRACE_STEPS TRAIN_ARGS
                        the runs' `harness train` flags (TRAIN_ARGS: any others but the task's)
    CORES_PER_NODE DEPTH THREADS   cores a rank is bound to (--depth), its CPU threads
    SRUN_MPI            srun --mpi (Slurm sites)
    RUN_TIMEOUT         seconds before a run is killed
    RESUBMIT            auto (where the queue allows it) | 1 (required) | 0 (never)
    MAX_RESUBMISSIONS   bound on the job chain
    STOP_BEFORE_WALLTIME  seconds before the walltime at which the runs checkpoint (PBS)
    RENDEZVOUS_DOMAIN   appended to rank 0's host for the rendezvous (default: the site's network)
    NCCL_NET_PLUGIN     on (default) | off: the site's libfabric plugin for NCCL/RCCL, or none of
                        its variables (ALCF's advice where it hangs DeepSpeed; harness.study.jobs.network)
    JOB_DIR SWEEP_ID    the job's directory and the records' tag; JOB_DIR defaults to
                        <the site's scratch>/<template>-<job id> (the profile's job_root: Eagle or
                        Flare's project directory at ALCF, $SCRATCH at NERSC, Orion at OLCF), else
                        the kit's runs/<template>-<job id>; under $HOME it is warned of
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...config import DEFAULT_TASK
from ...errors import UsageError
from ..scaling.sweep import RUN_TEMPLATE, SweepSettings
from ..scaling.task_spec import absolute_spec, parse_task_args, task_arg_words
from ..sites import SiteProfile
from .network import plugin_choice
from .scheduler import Allocation

RESUBMIT_CHOICES = ("auto", "1", "0")
BUILTIN_DEFAULTS = {
    "SCALING": "weak",
    "REPEATS": "1",
    "DATA_DIR": "",
    "GLOBAL_BATCH": "",
    "EPOCHS": "1000",
    "TRAIN_ARGS": "",
    "TASK": DEFAULT_TASK,
    "TASK_ARGS": "",
    "PROCS_PER_GPU": "1",
    "RUN_TIMEOUT": "3600",
    "RESUBMIT": "auto",
    "MAX_RESUBMISSIONS": "10",
    "TRACE_STEPS": "10",
    "STOP_BEFORE_WALLTIME": "300",
    "SRUN_MPI": "",
    "SCALE_BY": "ranks",
    "NCCL_NET_PLUGIN": "on",
}
SETTINGS_FILE = "study.json"


@dataclass
class StudySettings:
    """Everything a job study runs with, resolved and checked (saved as JOB_DIR/study.json)."""

    backends: list[str]
    ranks: list[int]
    ranks_per_node: int
    gpus_per_node: int
    procs_per_gpu: int
    scaling: str
    repeats: int
    model: str
    dataset: str
    data_dir: str
    batch_size: int
    global_batch: Optional[int]
    epochs: int
    steps: int
    precision: str
    checkpoint_every: int
    trace_steps: int
    train_args: list[str]
    depth: int
    threads: int
    cpus_per_task: int
    srun_mpi: str
    run_timeout: float
    resubmit: str
    max_resubmissions: int
    stop_before_walltime: int
    rendezvous_domain: str
    job_dir: str
    sweep_id: str
    network_plugin: str = "on"  # NCCL_NET_PLUGIN; a default, for the study.json of an older job
    task: str = DEFAULT_TASK  # TASK (a file's path absolute); model, dataset and data_dir are the images task's
    task_args: dict[str, Any] = dataclasses.field(default_factory=dict)  # TASK_ARGS
    smoke: bool = False  # SMOKE=1: a smoke job (harness.study.jobs.smoke) writes JOB_DIR/verified_on.json

    def task_flags(self) -> list[str]:
        """The runs' --task and its arguments (the images task's as its own flags)."""
        if self.task == DEFAULT_TASK:
            flags = ["--model", self.model, "--dataset", self.dataset]
            flags += ["--data-dir", self.data_dir] if self.data_dir else []
        else:
            flags = ["--task", self.task]
        return flags + task_arg_words(self.task_args)

    def train_flags(self) -> list[str]:
        """The `harness train` flags every run of the study shares."""
        flags = [
            *self.task_flags(),
            "--batch-size",
            str(self.batch_size),
            "--epochs",
            str(self.epochs),
            "--max-steps",
            str(self.steps),
            "--precision",
            self.precision,
            "--threads",
            str(self.threads),
            "--checkpoint-every",
            str(self.checkpoint_every),
            "--trace-steps",
            str(self.trace_steps),
        ]
        if self.global_batch is not None:
            flags += ["--global-batch", str(self.global_batch)]
        if self.procs_per_gpu > 1:
            flags += ["--procs-per-gpu", str(self.procs_per_gpu)]
        return flags + self.train_args

    def save(self) -> str:
        path = os.path.join(self.job_dir, SETTINGS_FILE)
        with open(path, "w") as handle:
            json.dump(dataclasses.asdict(self), handle, indent=1)
        return path


def load_settings(job_dir: str) -> Optional[StudySettings]:
    """The settings a job of this study saved in `job_dir`, if one did: a resubmitted job runs them."""
    path = os.path.join(job_dir, SETTINGS_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as handle:
        return StudySettings(**json.load(handle))


def _words(text: str) -> list[str]:
    return text.replace(",", " ").split()


def _positive(name: str, text: str, zero: bool = False) -> int:
    if not text.isdigit() or (int(text) == 0 and not zero):
        raise UsageError(f"{name}={text!r} is not a {'non-negative' if zero else 'positive'} integer; e.g. {name}=2")
    return int(text)


def _given(get: Callable[[str], str], name: str, default: Any, zero: bool = False) -> Any:
    """NAME's value as a number where it is set, else `default`."""
    return _positive(name, get(name), zero) if get(name) else default


def _counts(name: str, text: str, limit: int, unit: str, fix: str) -> list[int]:
    counts = [_positive(name, word) for word in _words(text)]
    if not counts:
        raise UsageError(f'{name} is empty; e.g. {name}="1 2"')
    too_many = [count for count in counts if count > limit]
    if too_many:
        raise UsageError(f"{name}={text}: {too_many[0]} {unit} do not fit the job's {limit}; {fix}")
    return sorted(set(counts))


def powers_of_two_up_to(n: int) -> list[int]:
    """1 2 4 ... below n, and n itself."""
    values, value = [], 1
    while value < n:
        values.append(value)
        value *= 2
    return values + [n]


def _ranks(get: Callable[[str], str], nodes: int, per_node: int) -> list[int]:
    total = nodes * per_node
    if get("RANKS"):
        return _counts(
            "RANKS", get("RANKS"), total, "ranks", f"the job has {nodes} node(s) x {per_node} ranks per node"
        )
    if get("NODES") or get("SCALE_BY") == "nodes":
        node_counts = (
            _counts("NODES", get("NODES"), nodes, "nodes", "request more nodes or drop it")
            if get("NODES")
            else powers_of_two_up_to(nodes)
        )
        return [count * per_node for count in node_counts]
    return powers_of_two_up_to(total)


def _ranks_per_node(get: Callable[[str], str], profile: SiteProfile, gpus: int, allocation: Allocation) -> int:
    procs_per_gpu = _positive("PROCS_PER_GPU", get("PROCS_PER_GPU"))
    if get("RANKS_PER_NODE"):
        return _positive("RANKS_PER_NODE", get("RANKS_PER_NODE"))
    if gpus:
        return gpus * procs_per_gpu
    if profile.gpus_per_node:
        raise UsageError(
            f"no GPUs on this node, but {profile.name} nodes have {profile.gpus_per_node}; "
            "for a CPU run pass RANKS_PER_NODE=N and GPUS_PER_NODE=0"
        )
    return allocation.tasks_per_node or 1


def _procs_per_gpu(get: Callable[[str], str], gpus: int) -> int:
    """PROCS_PER_GPU, refused above 1 where the node has no GPU to share."""
    procs_per_gpu = _positive("PROCS_PER_GPU", get("PROCS_PER_GPU"))
    if procs_per_gpu > 1 and not gpus:
        raise UsageError(
            f"PROCS_PER_GPU={procs_per_gpu} shares GPUs between ranks, but the node has none; on CPUs "
            "run more RANKS with fewer THREADS each"
        )
    return procs_per_gpu


def _resubmit_choice(value: str) -> str:
    if value not in RESUBMIT_CHOICES:
        raise UsageError(f"RESUBMIT={value}: choose auto (where the queue allows it), 1 or 0")
    return value


def _backend_list(value: str) -> list[str]:
    """BACKENDS' words in order, each once."""
    backends = _words(value)
    if not backends:
        raise UsageError('BACKENDS is empty; e.g. BACKENDS="ddp deepspeed"')
    return list(dict.fromkeys(backends))


IMAGE_SETTINGS = {"MODEL": "model", "DATASET": "dataset", "DATA_DIR": "data_dir"}  # the images task's arguments


def _task_settings(get: Callable[[str], str], values: Mapping[str, str], kit_dir: str) -> dict[str, Any]:
    """TASK (a file's path made absolute against the kit), TASK_ARGS, and the images task's
    MODEL, DATASET and DATA_DIR: set (not a site's default) beside another TASK, refused."""
    task, task_args = get("TASK") or DEFAULT_TASK, parse_task_args(get("TASK_ARGS"))
    if any(word.startswith("--task") for word in shlex.split(get("TRAIN_ARGS"))):
        raise UsageError('TRAIN_ARGS names the task; set TASK=... and TASK_ARGS="KEY=VALUE ..." instead')
    if task == DEFAULT_TASK:
        given = [key for key, name in IMAGE_SETTINGS.items() if name in task_args]
        if given:
            raise UsageError(f"TASK_ARGS sets the images task's {' and '.join(given)}: set {given[0]}=... instead")
        return {"task": task, "task_args": task_args, **{name: get(key) for key, name in IMAGE_SETTINGS.items()}}
    given = [name for name in IMAGE_SETTINGS if (values.get(name) or "").strip()]
    if given:
        raise UsageError(
            f"{' and '.join(given)} {'is an argument' if len(given) == 1 else 'are arguments'} of the images task, "
            f"not of TASK={task}; drop {'it' if len(given) == 1 else 'them'}, and give the task's own as "
            'TASK_ARGS="KEY=VALUE ..."'
        )
    return {"task": absolute_spec(task, kit_dir), "task_args": task_args, "model": "", "dataset": "", "data_dir": ""}


def site_defaults(profile: SiteProfile) -> dict[str, str]:
    """Every setting's value where the job sets none: the kit's, then the site profile's."""
    return {
        **BUILTIN_DEFAULTS,
        "BACKENDS": " ".join(profile.backends),
        "RENDEZVOUS_DOMAIN": profile.rendezvous_domain,
        **profile.defaults,
    }


def resolve_settings(
    profile: SiteProfile,
    values: Mapping[str, str],
    allocation: Allocation,
    gpus_detected: int,
    default_job_dir: str,
    kit_dir: Optional[str] = None,
) -> StudySettings:
    """Settings from `values` (NAME=VALUE) over the site's defaults, checked against the allocation (a
    relative TASK file read from `kit_dir`, default the kit); bad input raises UsageError naming the fix."""
    defaults = site_defaults(profile)

    def get(name: str) -> str:
        value = values.get(name)
        return (defaults.get(name, "") if value is None else value).strip()

    gpus = _given(get, "GPUS_PER_NODE", gpus_detected, zero=True)
    per_node = _ranks_per_node(get, profile, gpus, allocation)
    procs_per_gpu = _procs_per_gpu(get, gpus)
    cores = _given(get, "CORES_PER_NODE", profile.cores_per_node or os.cpu_count() or 1)
    depth = _given(get, "DEPTH", max(1, cores // per_node))
    threads = _given(get, "THREADS", allocation.cpus_per_task or depth)
    resubmit, backends = _resubmit_choice(get("RESUBMIT")), _backend_list(get("BACKENDS"))
    job_dir = get("JOB_DIR") or default_job_dir
    job_dir = os.path.realpath(job_dir) if job_dir else ""
    return StudySettings(
        backends=backends,
        ranks=_ranks(get, allocation.nodes, per_node),
        ranks_per_node=per_node,
        gpus_per_node=gpus,
        procs_per_gpu=procs_per_gpu,
        scaling=get("SCALING"),
        repeats=_positive("REPEATS", get("REPEATS")),
        **_task_settings(get, values, kit_dir or kit_directory(values)),
        batch_size=_positive("BATCH_SIZE", get("BATCH_SIZE")),
        global_batch=_given(get, "GLOBAL_BATCH", None),
        epochs=_positive("EPOCHS", get("EPOCHS")),
        steps=_positive("STEPS", get("STEPS")),
        precision=get("PRECISION"),
        checkpoint_every=_positive("CHECKPOINT_EVERY", get("CHECKPOINT_EVERY")),
        trace_steps=_positive("TRACE_STEPS", get("TRACE_STEPS"), zero=True),
        train_args=shlex.split(get("TRAIN_ARGS")),
        depth=depth,
        threads=threads,
        cpus_per_task=allocation.cpus_per_task or threads,
        srun_mpi=get("SRUN_MPI"),
        run_timeout=float(_positive("RUN_TIMEOUT", get("RUN_TIMEOUT"))),
        resubmit=resubmit,
        max_resubmissions=_positive("MAX_RESUBMISSIONS", get("MAX_RESUBMISSIONS"), zero=True),
        stop_before_walltime=_positive("STOP_BEFORE_WALLTIME", get("STOP_BEFORE_WALLTIME"), zero=True),
        rendezvous_domain=get("RENDEZVOUS_DOMAIN"),
        job_dir=job_dir,
        sweep_id=get("SWEEP_ID") or os.path.basename(job_dir),
        network_plugin=plugin_choice(get("NCCL_NET_PLUGIN")),
        smoke=get("SMOKE") == "1",
    )


def default_job_dir(
    profile: SiteProfile, kit_dir: str, stem: str, job_id: str, account: Optional[str], environ: Mapping[str, str]
) -> str:
    """A job's directory where JOB_DIR is not set: `stem`-`job_id` on the site's scratch file system
    (the profile's job_root, needing the job's account where it names the project's directory),
    else in the kit's runs/."""
    root = profile.scratch_root(account, environ) or os.path.join(kit_dir, "runs")
    return os.path.join(root, f"{stem}-{job_id}")


def home_warning(name: str, path: str, profile: Optional[SiteProfile], environ: Mapping[str, str]) -> Optional[str]:
    """One line where `path` lies under $HOME, which clusters keep small and slow for job data
    (quotas of 40-50 GB at ALCF, NERSC and OLCF); None elsewhere."""
    home = environ.get("HOME")
    if not home or not path:
        return None
    real, home = os.path.realpath(path), os.path.realpath(home)
    if real != home and not real.startswith(home.rstrip("/") + "/"):
        return None
    scratch = (profile.job_root.get("path") if profile else None) or "the site's scratch or project file system"
    return f"{name}={path} is under $HOME ({home}), small and slow for job data; set {name} under {scratch}"


def kit_directory(environ: Mapping[str, str]) -> str:
    """The kit: KIT_DIR, else the checkout this harness package is part of."""
    return os.path.realpath(
        environ.get("KIT_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
    )


def site_launch(profile: SiteProfile, settings: StudySettings, kit_dir: str) -> str:
    """The site launcher's words for one run of the study, {ranks} {ppn} {nodes} left to fill."""
    values = {
        "depth": settings.depth,
        "threads": settings.threads,
        "cpus_per_task": settings.cpus_per_task,
        "kit": kit_dir,
    }
    if profile.cpu_sockets:  # a list binding: each rank's cores on one socket (Aurora)
        values["cpu_list"] = profile.cpu_bind_list(settings.ranks_per_node, settings.depth)
    return profile.launch_template(values, settings.gpus_per_node, settings.srun_mpi, settings.procs_per_gpu > 1)


def sweep_settings(profile: SiteProfile, settings: StudySettings, kit_dir: str) -> SweepSettings:
    """The study as one `harness sweep` through the site launcher, everything under JOB_DIR."""
    return SweepSettings(
        backends=settings.backends,
        ranks=settings.ranks,
        scaling=settings.scaling,
        results=os.path.join(settings.job_dir, "results.jsonl"),
        train_args=settings.train_flags(),
        repeats=settings.repeats,
        launch_template=f"{site_launch(profile, settings, kit_dir)} {RUN_TEMPLATE}",
        ppn=settings.ranks_per_node,
        sweep_id=settings.sweep_id,
        run_timeout=settings.run_timeout,
        log_dir=os.path.join(settings.job_dir, "logs"),
        checkpoint_root=os.path.join(settings.job_dir, "checkpoints"),
    )
