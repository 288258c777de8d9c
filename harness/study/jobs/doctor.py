"""`harness doctor`: what this node offers a run, one line per topic, before anything is queued.

Run it on a login node, then on a compute node (in an interactive job), after loading the
software the job will load: it reads the loaded modules, the Python and which backends it can run
(each backend's own availability check), the MPI launchers on PATH and their family, the
collective library's network plugin, the GPUs this process sees and the variable binding them, the
batch system's commands, the file system the job directory lies on, and the site, known from its
host names or variables (the profiles' `identify`), with its queues.

Each line is ok, a warning (the run may go on, slower or worse placed: job data under $HOME, a
login node without the site's GPUs or plugin) or a problem (a job run from here stops: a backend
the site studies by default missing, a job directory that cannot be written, a job without the
site's GPUs). The exit status says which: 0 all ok, 1 warnings, 2 a problem.

It lives in the study layer because it reads the site profiles beside the backends' checks; it
imports no framework itself (harness.backends does, each backend for its own check).
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import shutil
import socket
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from ...backends import BACKENDS, get_backend
from ...errors import UsageError, first_line, require
from ...process.accelerator import VISIBILITY_VARIABLES, Accelerator, detect_accelerator
from ...process.discovery import RANK_VARIABLES
from ..sites import SiteProfile, load_site, site_names
from ..sites.walltime import format_walltime
from .network import check_network_plugin
from .settings import default_job_dir, home_warning, kit_directory

LEVELS = ("ok", "warning", "problem")
EXIT_STATUS = {"ok": 0, "warning": 1, "problem": 2}  # the worst line's level is the exit status
LAUNCHERS = ("mpiexec", "mpirun", "srun", "aprun")
SCHEDULER_COMMANDS = {"slurm": ("sbatch", "squeue", "sinfo"), "pbs": ("qsub", "qstat", "pbsnodes")}
JOB_VARIABLES = {"slurm": "SLURM_JOB_ID", "pbs": "PBS_JOBID"}
ACCOUNT_VARIABLES = ("PBS_ACCOUNT", "SLURM_JOB_ACCOUNT", "SBATCH_ACCOUNT")
# the files NCCL/RCCL load as their network plugin (aws-ofi-nccl, aws-ofi-rccl)
PLUGIN_PATTERNS = ("libnccl-net*.so*", "librccl-net*.so*")
GPU_VARIABLES = tuple(dict.fromkeys(v for v in (*VISIBILITY_VARIABLES.values(), "HIP_VISIBLE_DEVICES") if v))


@dataclass(frozen=True)
class Finding:
    """One line of the doctor's report."""

    topic: str
    level: str  # one of LEVELS
    text: str


@dataclass
class DoctorReport:
    """The doctor's lines, the site they were judged against (None: not at a known site)."""

    findings: list[Finding]
    site: Optional[str]

    @property
    def status(self) -> int:
        """0: all ok, 1: warnings, 2: a problem that stops a job run from here."""
        return max((EXIT_STATUS[finding.level] for finding in self.findings), default=0)

    def lines(self) -> list[str]:
        width = max(len(finding.topic) for finding in self.findings)
        return [f"{finding.level:<7}  {finding.topic:<{width}}  {finding.text}" for finding in self.findings]

    def to_dict(self) -> dict:
        return {"status": self.status, "site": self.site, "checks": [asdict(f) for f in self.findings]}


@dataclass(frozen=True)
class Node:
    """What the doctor reads of this node: injected by the tests, read from the process otherwise."""

    environ: Mapping[str, str]
    hostname: str
    accelerator: Callable[[], Accelerator]
    backends: Callable[[], dict[str, Optional[str]]]  # name -> None where it runs, else why not
    mounts: str = "/proc/mounts"

    def which(self, program: str) -> Optional[str]:
        return shutil.which(program, path=self.environ.get("PATH", ""))

    @property
    def in_job(self) -> bool:
        return any(self.environ.get(variable) for variable in JOB_VARIABLES.values())


def backend_availability() -> dict[str, Optional[str]]:
    """Each registered backend: None where its framework loads here, else the one line why not."""
    found: dict[str, Optional[str]] = {}
    for name in BACKENDS:
        try:
            get_backend(name).check_available()
            found[name] = None
        except UsageError as exc:
            found[name] = first_line(exc)
    return found


def this_node(environ: Optional[Mapping[str, str]] = None) -> Node:
    """This process's node as the doctor reads it."""
    return Node(
        environ=dict(os.environ if environ is None else environ),
        hostname=socket.getfqdn(),
        accelerator=detect_accelerator,
        backends=backend_availability,
    )


def identify_site(environ: Mapping[str, str], hostname: str) -> Optional[SiteProfile]:
    """The kit's profile whose `identify` patterns match this host, if one does."""
    for name in site_names():
        profile = load_site(name)
        if profile.identified_by(environ, hostname):
            return profile
    return None


def diagnose(node: Node, site: Optional[str] = None, job_dir: Optional[str] = None) -> DoctorReport:
    """Every check on `node`, against `site` (a profile's name or path; None: the site identified
    from the node, if any); `job_dir` is where the job's data will go (default: JOB_DIR, else the
    site's default)."""
    profile = load_site(site) if site else identify_site(node.environ, node.hostname)
    accelerator = node.accelerator()
    findings = [
        check_site(profile, site is not None),
        check_modules(node.environ),
        check_python(node, profile),
        check_mpi(node, profile),
        check_network(node, profile, accelerator.count),
        check_gpus(node, profile, accelerator),
        check_scheduler(node, profile),
        check_job_dir(node, profile, job_dir),
    ]
    return DoctorReport(findings, profile.name if profile else None)


def check_site(profile: Optional[SiteProfile], named: bool) -> Finding:
    """The site, and its queues with their node and walltime limits."""
    if profile is None:
        known = ", ".join(name for name in site_names() if not name.startswith("generic"))
        return Finding("site", "ok", f"not at a known site ({known}); --site NAME judges this node as one")
    how = "named by --site" if named else "identified from this host"
    queues = [
        f"{queue.name} {queue.node_range()}"
        + (f" {format_walltime(queue.max_walltime_s)}" if queue.max_walltime_s else "")
        for queue in profile.queues.values()
        if not queue.execution_only
    ]
    listed = f"; queues: {', '.join(queues)}" if queues else ""
    return Finding("site", "ok", f"{profile.name} ({how}): {profile.description}{listed}")


def check_modules(environ: Mapping[str, str]) -> Finding:
    """The environment modules loaded (LOADEDMODULES, which Lmod and Environment Modules keep)."""
    loaded = [name for name in environ.get("LOADEDMODULES", "").split(":") if name]
    if loaded:
        return Finding("modules", "ok", " ".join(loaded))
    system = "module system present" if environ.get("MODULESHOME") or environ.get("LMOD_CMD") else "no module system"
    return Finding("modules", "ok", f"none loaded ({system})")


def _version(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python(node: Node, profile: Optional[SiteProfile]) -> Finding:
    """The Python, its environment, torch's version and the backends it runs; a problem where one
    BACKENDS names, or else the site studies by default, is missing (the job would exit 2 at its start)."""
    environment = (
        f"venv {sys.prefix}"
        if sys.prefix != sys.base_prefix
        else f"conda {node.environ['CONDA_PREFIX']}"
        if node.environ.get("CONDA_PREFIX")
        else "no venv"
    )
    backends = node.backends()
    ready = [name for name, why in backends.items() if why is None]
    missing = {name: why for name, why in backends.items() if why is not None}
    text = f"{sys.version.split()[0]} at {sys.executable} ({environment}), torch {_version('torch') or 'missing'}; "
    text += f"backends ready: {', '.join(ready) or 'none of them'}"
    text += "".join(f"; {why}" for why in missing.values())
    asked = node.environ.get("BACKENDS", "").replace(",", " ").split()  # the study's setting, as a job reads it
    needed = [name for name in asked or (profile.backends if profile else ()) if name in missing]
    if not needed:
        return Finding("python", "ok", text)
    who = "BACKENDS asks for" if asked else f"{profile.name} studies by default"
    return Finding("python", "problem", f"{text}; {who} {' '.join(needed)}")


def mpi_family(node: Node, launcher: Optional[str]) -> str:
    """The MPI the launcher on PATH belongs to, by what lies beside it or the environment says:
    OpenMPI (ompi_info), Cray MPICH (the Cray programming environment's variables, or Cray PALS's
    mpiexec), Intel MPI (I_MPI_ROOT), MPICH (mpichversion, Hydra's proxy), else unknown."""
    environ = node.environ
    where = os.path.dirname(os.path.realpath(launcher)) if launcher else ""

    def beside(*tools: str) -> bool:
        return bool(where) and any(os.path.exists(os.path.join(where, tool)) for tool in tools)

    if beside("ompi_info"):
        return "OpenMPI"
    if environ.get("CRAY_MPICH_DIR") or environ.get("CRAY_MPICH_VERSION") or "/cray/pals" in where:
        return "Cray MPICH" + (" (PALS mpiexec)" if "/cray/pals" in where else "")
    if environ.get("I_MPI_ROOT"):
        return "Intel MPI"
    if beside("mpichversion", "hydra_pmi_proxy"):
        return "MPICH"
    return "OpenMPI" if node.which("ompi_info") else "unknown family"


def check_mpi(node: Node, profile: Optional[SiteProfile]) -> Finding:
    """The launchers on PATH, their MPI family, the launcher variables set here, and mpi4py; a
    warning where the site's launcher is missing or its ranks need mpi4py and it is not installed."""
    found = {name: node.which(name) for name in LAUNCHERS}
    on_path = [f"{name} ({path})" for name, path in found.items() if path]
    launcher = found["mpiexec"] or found["mpirun"]
    family = mpi_family(node, launcher) if launcher else "no MPI launcher"
    variables = [f"{name} ({family_name})" for name, family_name in RANK_VARIABLES if node.environ.get(name)]
    try:  # found, not imported: importing mpi4py.MPI would initialise MPI in this process
        has_mpi4py = require("mpi4py", "a rank that asks MPI for rank 0's host", "pip install mpi4py", load=False)
    except UsageError:
        has_mpi4py = None
    text = f"{family}; on PATH: {', '.join(on_path) or 'none of ' + ' '.join(LAUNCHERS)}"
    text += f"; rank variables: {', '.join(variables) or 'none (not a rank)'}"
    text += f"; mpi4py {(_version('mpi4py') or 'installed') if has_mpi4py else 'missing'}"
    site_launcher = profile.launch.split()[0] if profile else None
    if site_launcher and not found.get(site_launcher, node.which(site_launcher)):
        return Finding("mpi", "warning", f"{text}; {profile.name} launches with {site_launcher}, not on PATH here")
    if profile and profile.import_first.get("module", "").startswith("mpi4py") and not has_mpi4py:
        return Finding(
            "mpi", "warning", f"{text}; {profile.name}'s ranks import mpi4py before torch: pip install mpi4py"
        )
    return Finding("mpi", "ok", text)


def _plugin_files(directories: list[str]) -> list[str]:
    return [
        path
        for d in directories
        for pattern in PLUGIN_PATTERNS
        for path in sorted(glob.glob(os.path.join(d, pattern)))
    ]


def check_network(node: Node, profile: Optional[SiteProfile], gpus: int) -> Finding:
    """NCCL/RCCL's network plugin on LD_LIBRARY_PATH (the site's, from its profile, where it names
    one): a problem where this node's GPUs would need it, a warning on a node without GPUs."""
    directories = [d for d in node.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    files = _plugin_files(directories)
    net = node.environ.get("NCCL_NET")
    text = f"{', '.join(files) or 'no libnccl-net/librccl-net on LD_LIBRARY_PATH'}" + (
        f"; NCCL_NET={net}" if net else ""
    )
    plugin = profile.network_plugin if profile else None
    if plugin is None:
        return Finding("network plugin", "ok", text)
    missing = check_network_plugin(profile, "on", max(gpus, 1), node.environ)
    if not missing:
        return Finding("network plugin", "ok", f"{plugin.library} found; {text}")
    return Finding("network plugin", "problem" if gpus else "warning", missing[0])


def check_gpus(node: Node, profile: Optional[SiteProfile], accelerator: Accelerator) -> Finding:
    """The devices this process sees and the variables binding them; at a GPU site none is a
    warning on a login node and a problem inside a job."""
    binding = [f"{name}={node.environ[name]}" for name in GPU_VARIABLES if name in node.environ]
    bound = f" ({', '.join(binding)})" if binding else " (no binding variable set)"
    if accelerator.count:
        return Finding("gpus", "ok", f"{accelerator.count} {accelerator.kind}{bound}")
    text = f"none visible: CPU ranks (gloo){bound}"
    if not profile or not profile.gpus_per_node:
        return Finding("gpus", "ok", text)
    if node.in_job:
        return Finding(
            "gpus", "problem", f"{text}; {profile.name}'s nodes have {profile.gpus_per_node}: ask the job for them"
        )
    return Finding(
        "gpus", "warning", f"{text}; {profile.name}'s compute nodes have {profile.gpus_per_node}: run doctor there"
    )


def check_scheduler(node: Node, profile: Optional[SiteProfile]) -> Finding:
    """The batch systems whose commands are on PATH, and the job this runs in; a warning where the
    site's are missing."""
    found = {name: [c for c in commands if node.which(c)] for name, commands in SCHEDULER_COMMANDS.items()}
    present = [f"{name} ({' '.join(commands)})" for name, commands in found.items() if commands]
    jobs = [
        f"{variable}={node.environ[variable]}" for variable in JOB_VARIABLES.values() if node.environ.get(variable)
    ]
    text = f"{', '.join(present) or 'no Slurm or PBS commands on PATH'}; {'in job ' + jobs[0] if jobs else 'not in a job'}"
    if profile and not found[profile.scheduler]:
        return Finding("scheduler", "warning", f"{text}; {profile.name} runs {profile.scheduler}")
    return Finding("scheduler", "ok", text)


def _existing(path: str) -> str:
    """`path`, or its nearest ancestor that exists (the job makes the rest)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def file_system_type(path: str, mounts: str) -> str:
    """The type of the file system `path` lies on (the longest mount point above it), from a
    /proc/mounts-style table; "unknown" where it cannot be read."""
    try:
        with open(mounts) as handle:
            table = [line.split() for line in handle]
    except OSError:
        return "unknown"
    real, best = os.path.realpath(path), ("", "unknown")
    for fields in table:
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) > len(best[0]):
            best = (point, fields[2])
    return best[1]


def doctor_job_dir(node: Node, profile: Optional[SiteProfile]) -> str:
    """Where a job's data would go: JOB_DIR, else the site's scratch default, else the kit's runs/."""
    if node.environ.get("JOB_DIR"):
        return node.environ["JOB_DIR"]
    kit = kit_directory(node.environ)
    if profile is None:
        return os.path.join(kit, "runs")
    account = next((node.environ[v] for v in ACCOUNT_VARIABLES if node.environ.get(v)), None)
    return os.path.dirname(default_job_dir(profile, kit, "study", "<job id>", account, node.environ))


def check_job_dir(node: Node, profile: Optional[SiteProfile], job_dir: Optional[str]) -> Finding:
    """The job directory's file system, its free space and whether it can be written; a warning
    under $HOME or where the site warns of it, a problem where it cannot be written."""
    path = os.path.abspath(job_dir or doctor_job_dir(node, profile))
    existing = _existing(path)
    usage = shutil.disk_usage(existing)
    text = f"{path} on {file_system_type(existing, node.mounts)}, {usage.free / 2**30:.0f} GiB free"
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK):
        return Finding("job directory", "problem", f"{text}; {existing} cannot be written: set JOB_DIR elsewhere")
    entry = profile.storage_for(path, node.environ) if profile else None
    warning = entry.warn if entry and entry.warn else home_warning("JOB_DIR", path, profile, node.environ)
    return Finding("job directory", "warning" if warning else "ok", f"{text}; {warning}" if warning else text)
