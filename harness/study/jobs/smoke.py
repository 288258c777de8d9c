"""The night before a study: `harness study --smoke` (`bash submissions/polaris.sc --smoke -- -A
<project>`) queues the job template itself as a short smoke job, waits for it through the queue,
and prints its result in the form a site profile's `verified_on` takes.

The smoke job is the template with a few settings changed: the site's debug queue (its `debug`
queue, or on a site that names queues by partition its `debug` QOS; where the profile lists none,
the queue the command line asks for), a 10-minute walltime, and one run of DDP for 20 steps on
every node of the request, not resubmitted. Everything else (modules, venv, launcher, binding,
network plugin, job directory) is the template's own, so a smoke job that passes has started the
real study's software on the real nodes. The job writes `verified_on.json` into its JOB_DIR (its
result, the node count, the software versions the run recorded and the modules loaded), and
`--smoke` prints it, with the line to paste into the profile, as soon as the job ends.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable, Optional

from ...errors import UsageError
from ...fileio import atomic_write_json
from ..sites import SiteProfile
from .jobdir import StudyJob
from .scheduler import read_job
from .submit import parse_pbs_variables

SMOKE_WALLTIME = "00:10:00"
SMOKE_STEPS = 20
SMOKE_BACKEND = "ddp"
SMOKE_FILE = "verified_on.json"
POLL_S = 10.0
# A job's last states: Slurm's (scontrol's job_state) and PBS's (F: finished, E: exiting).
ENDED_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "F", "E"}
)


def smoke_settings(nodes: int, job_dir: str) -> dict[str, str]:
    """The study settings a smoke job runs with: DDP, SMOKE_STEPS steps, once, on all `nodes`."""
    return {
        "BACKENDS": SMOKE_BACKEND,
        "STEPS": str(SMOKE_STEPS),
        "REPEATS": "1",
        "NODES": str(nodes),
        "RANKS": "",  # NODES, not a rank list the user set for the study
        "RESUBMIT": "0",
        "SMOKE": "1",
        "JOB_DIR": job_dir,
    }


def debug_queue(profile: SiteProfile) -> Optional[tuple[str, str]]:
    """(option, name) of the site's debug queue: ("queue", "debug"), ("qos", "debug"); None where the
    profile lists none (the request's own queue is used)."""
    if "debug" in profile.queues:
        return profile.queue_field, "debug"
    if "debug" in profile.qos:
        return "qos", "debug"
    return None


def smoke_request(
    profile: SiteProfile, scheduler_args: Sequence[str], environ: Mapping[str, str], nodes: int, job_dir: str
) -> tuple[list[str], dict[str, str]]:
    """The qsub/sbatch options and the environment of the smoke job of a request for `nodes` nodes
    made with `scheduler_args`: the request's own options, then the debug queue, the walltime and the
    job name (the command line over the script's directives, as qsub and sbatch read them). PBS
    passes the settings in the job's one -v list (the request's own -v entries kept, ours over them);
    Slurm in the environment sbatch exports."""
    settings = smoke_settings(nodes, job_dir)
    queue = debug_queue(profile)
    environment = dict(environ)
    if profile.scheduler == "pbs":
        args, variables = _without_pbs_variables(scheduler_args, environ)
        args += ["-q", queue[1]] if queue else []
        args += ["-l", f"walltime={SMOKE_WALLTIME}", "-N", "harness-smoke"]
        args += ["-v", ",".join(_pbs_entry(name, value) for name, value in {**variables, **settings}.items())]
    else:
        args = list(scheduler_args) + ([f"--{queue[0]}={queue[1]}"] if queue else [])
        args += [f"--time={SMOKE_WALLTIME}", "--job-name=harness-smoke"]
        environment.update(settings)
    return args, environment


def _without_pbs_variables(args: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """`args` less their -v lists, and the variables those lists set."""
    kept, variables, words = [], {}, iter(args)
    for word in words:
        if word == "-v":
            variables.update(parse_pbs_variables(next(words, ""), environ))
        elif word.startswith("-v") and len(word) > 2:
            variables.update(parse_pbs_variables(word[2:], environ))
        else:
            kept.append(word)
    return kept, variables


def _pbs_entry(name: str, value: str) -> str:
    return f'{name}="{value}"' if "," in value else f"{name}={value}"


def write_verification(job: StudyJob, status: int, records: Sequence[dict[str, Any]]) -> str:
    """In a smoke job: JOB_DIR/verified_on.json from the sweep's `status` and its run `records`."""
    runs = [record for record in records if record.get("throughput")]
    run = max(runs, key=lambda record: record.get("world_size", 0), default=None)
    passed = status == 0 and run is not None
    nodes = -(-run["world_size"] // job.settings.ranks_per_node) if run else job.allocation.nodes
    versions = (run or {}).get("versions", {})
    software = ", ".join(f"{name} {version}" for name, version in sorted(versions.items()))
    summary = (
        f"{datetime.date.today().isoformat()}: job {job.job_id}, {nodes} node(s) x {job.settings.ranks_per_node} "
        f"ranks, {SMOKE_BACKEND} {SMOKE_STEPS} steps at {run['throughput']:.0f} samples/s; {software}"
        if passed
        else f"smoke job {job.job_id} failed (sweep status {status}); see {job.path('logs')}"
    )
    document = {
        "site": job.profile.name,
        "passed": passed,
        "verified_on": summary,
        "job_id": job.job_id,
        "nodes": nodes,
        "versions": versions,
        "modules": os.environ.get("LOADEDMODULES", "").split(":") if os.environ.get("LOADEDMODULES") else [],
    }
    path = job.path(SMOKE_FILE)
    atomic_write_json(path, document)
    return path


def wait_for_smoke(
    profile: SiteProfile,
    job_id: str,
    job_dir: str,
    environ: Mapping[str, str],
    poll_s: float = POLL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Wait for smoke job `job_id` to write its result, then print it: 0 where it passed, 1 where it
    failed or ended without a result (the line says where to look)."""
    path = os.path.join(job_dir, SMOKE_FILE)
    print(f"smoke job {job_id} queued; waiting for its result in {path} (Ctrl-C stops the wait, not the job)")
    ended = False
    while not os.path.exists(path):
        if ended:  # one more look after the end: a shared file system shows a new file late
            print(
                f"harness study: error: smoke job {job_id} ended without a result; read its output in "
                f"{job_dir} (or where it was submitted) and `harness study --check` the template",
                file=sys.stderr,
                flush=True,
            )
            return 1
        ended = _ended(profile, job_id, environ)
        sleep(poll_s)
    with open(path) as handle:
        result = json.load(handle)
    if not result["passed"]:
        print(f"harness study: error: {result['verified_on']}", file=sys.stderr, flush=True)
        return 1
    print(f"smoke job passed: {result['verified_on']}")
    print(f'for harness/study/sites/{profile.name}.json: "verified_on": {json.dumps(result["verified_on"])}')
    return 0


def _ended(profile: SiteProfile, job_id: str, environ: Mapping[str, str]) -> bool:
    """Whether the scheduler shows the job ended, or no longer knows it (qstat without -x, and
    scontrol after MinJobAge, forget finished jobs)."""
    try:
        record = read_job(profile.scheduler, job_id, profile.queue_field, environ)
    except UsageError:
        return True
    return bool(ENDED_STATES & set(record.states))
