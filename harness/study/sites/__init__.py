"""Site profiles: what a job study needs to know about a cluster, as data (one JSON file per site).

A profile names its batch system, the site launcher's words for one run (a template whose
placeholders the study fills), ranks and GPUs per node, CPU binding, GPU affinity order, the
network variables, the software environment, the queues with their node and walltime limits and
whether a job may resubmit itself there, each with the other names job records give it (`aliases`:
Perlmutter's gpu_debug for -q debug) (and, at a Slurm site whose queues are partitions, the
QOSes a job may name beside its partition with -q, each with limits of its own: Frontier's debug),
the file systems job data may live on, the network's figures (NICs, links, latencies) that
`harness predict` models the site with, and the memory of the device a rank runs on
(`device_memory`, against which it predicts which backends fit). Site facts carry their source:
`network_plugin` (the collective library's libfabric plugin, whose variables are set only
together with it),
`import_first` (a module each rank imports before torch, and why), `pins` (each pinned software
version and the guide it comes from), `unlisted_queues` (queues a workshop uses whose limits the
profile cannot know: reservation and training queues), `refused_options` (submission options the
site says break its jobs), `job_root` (the scratch file system a job's directory goes to by
default), `identify` (the host names or variables `harness doctor` knows the site by) and
`verified_on` (the date the profile last ran there, or "not run there"). `polaris`, `perlmutter`, `aurora`, `frontier`,
`generic-slurm` and `generic-pbs` come with the kit; `--site path/to/site.json` takes another
written the same way.

Launch template placeholders, filled per site: {depth} {threads} {cpus_per_task} {gpus_per_node}
{gpu_order} {mpi} {kit}, {cpu_list} (an mpiexec --cpu-bind list from `cpu_sockets`, Aurora), and
the optional segments {gpu_flags} {gpu_binding} (when the nodes have
GPUs), {mpi_flags} (when SRUN_MPI is set) and {mps_wrapper} (when ranks share GPUs). {ranks} {ppn}
and {nodes} are left for the sweep, which fills them per run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from ...errors import UsageError, unknown_choice
from .walltime import parse_walltime

SITES_DIR = os.path.dirname(os.path.abspath(__file__))
SCHEDULERS = ("pbs", "slurm")
WARNINGS = ("timer", "signal")  # who warns the job before its walltime: the study itself, or Slurm's --signal
GPU_ORDERS = ("natural", "reverse")
SEGMENTS = ("gpu_flags", "gpu_binding", "mpi_flags", "mps_wrapper")
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
# a queue's or QOS's JSON fields and the type each must have, as a sentence for the error
_QUEUE_TYPES = {
    "min_nodes": (int, "a whole number"),
    "max_nodes": (int, "a whole number"),
    "max_running_jobs": (int, "a whole number"),
    "chaining": (bool, "true or false"),
    "execution_only": (bool, "true or false"),
    "note": (str, "a string"),
}


@dataclass(frozen=True)
class Queue:
    """One queue (PBS) or QOS/partition (Slurm) and what it accepts."""

    name: str
    min_nodes: int = 1
    max_nodes: Optional[int] = None
    max_walltime_s: Optional[int] = None
    chaining: bool = True  # may a job queue its own continuation here
    execution_only: bool = False  # jobs land here from a routing queue; users cannot submit to it
    routes_to: tuple[str, ...] = ()  # a routing queue: the execution queues its jobs land in
    preempt: Optional[str] = None  # "requeue": a preempted job is requeued by the scheduler itself
    max_running_jobs: Optional[int] = None  # a user's jobs running here at once (a later one waits)
    note: str = ""
    # the names the scheduler's job records give this queue (Perlmutter: a job submitted with
    # -q regular -C gpu runs in QOS gpu_regular): judged as this queue, resubmitted by its own name
    aliases: tuple[str, ...] = ()

    def accepts(self, nodes: int) -> bool:
        return self.min_nodes <= nodes <= (self.max_nodes if self.max_nodes is not None else nodes)

    def node_range(self) -> str:
        return f"{self.min_nodes}-{self.max_nodes if self.max_nodes is not None else 'any'} nodes"


@dataclass(frozen=True)
class Storage:
    """A file system prefix: its PBS `-l filesystems` name, or a warning for job data there."""

    path: str  # may hold $VARIABLES, expanded when checked
    filesystem: Optional[str] = None
    warn: Optional[str] = None


@dataclass(frozen=True)
class NetworkPlugin:
    """The collective library's network plugin (aws-ofi-nccl, aws-ofi-rccl): a library NCCL/RCCL
    loads from LD_LIBRARY_PATH. Its `variables` (NCCL_NET names it) are set only together with it:
    NCCL_NET naming a network whose plugin is not loaded fails every communicator at init."""

    library: str  # the file NCCL/RCCL dlopens, e.g. libnccl-net.so
    library_path: tuple[str, ...] = ()  # directories put first on LD_LIBRARY_PATH (may hold $VARIABLES)
    variables: dict[str, str] = field(default_factory=dict)  # set with the plugin, unset without it
    fix: str = ""  # how to get the plugin, for the one-line error when it is missing
    source: str = ""


@dataclass(frozen=True)
class UnlistedQueue:
    """Queues the profile cannot list (reservation queues, training queues): a name pattern; such a
    queue is accepted with a warning that its limits are not known here."""

    pattern: str  # a regular expression the whole queue name matches
    kind: str  # what such a queue is, for the warning ("reservation queue")
    source: str = ""


@dataclass(frozen=True)
class SiteProfile:
    """One cluster, as its JSON file describes it (see the module docstring)."""

    name: str
    description: str
    scheduler: str
    gpus_per_node: int
    cores_per_node: Optional[int]
    launch: str
    gpu_order: str
    warning: str
    software: str
    queue_field: str  # the job attribute that names its queue: queue (PBS), qos or partition (Slurm)
    account_required: bool = False  # the site refuses (or should not get) a job without -A
    gpu_flags: str = ""
    gpu_binding: str = ""
    mps: dict[str, str] = field(default_factory=dict)  # start/stop once per node, or wrapper per rank
    rendezvous_domain: str = ""
    environment: dict[str, str] = field(default_factory=dict)  # always set in the job
    environment_defaults: dict[str, str] = field(default_factory=dict)  # set unless the job has them
    backends: tuple[str, ...] = ()
    # backends the site's software cannot run at all (Horovod on Aurora's XPUs): refused by --check
    unsupported_backends: tuple[str, ...] = ()
    backend_notes: dict[str, str] = field(default_factory=dict)
    backend_requirements: dict[str, dict[str, bool]] = field(default_factory=dict)
    queues: dict[str, Queue] = field(default_factory=dict)
    # Slurm QOSes named beside the partition (-q), each with its own limits; only where queue_field
    # is "partition" (where it is "qos", `queues` are the QOSes)
    qos: dict[str, Queue] = field(default_factory=dict)
    storage: tuple[Storage, ...] = ()
    # usable cores of each CPU socket ("1-51"): where {cpu_list} puts ranks, so none straddles two
    cpu_sockets: tuple[str, ...] = ()
    defaults: dict[str, str] = field(default_factory=dict)
    # NICs, links and NCCL ring latencies for `harness predict` (harness.study.prediction.predict.network_from_site)
    network: dict[str, Any] = field(default_factory=dict)
    network_plugin: Optional[NetworkPlugin] = None
    # a module every rank imports before torch: {"module": ..., "reason": ..., "source": ...}
    import_first: dict[str, str] = field(default_factory=dict)
    # pinned software: {what: {"value": ..., "source": the guide it comes from}}
    pins: dict[str, dict[str, str]] = field(default_factory=dict)
    unlisted_queues: tuple[UnlistedQueue, ...] = ()
    # qsub/sbatch options the site says break its jobs: {option: why, with its source}
    refused_options: dict[str, str] = field(default_factory=dict)
    verified_on: str = "not run there"  # the date the profile last ran there
    # how `harness doctor` knows it runs at this site: {"hostname": a pattern searched in the fully
    # qualified host name, or a VARIABLE: a pattern its whole value matches}; any one match will do
    identify: dict[str, str] = field(default_factory=dict)
    # where a job's directory goes by default: {"path": the site's scratch file system for job data,
    # with $VARIABLES and {account} (the job's -A; {account_lower} lower-cased), "source": the guide}
    job_root: dict[str, str] = field(default_factory=dict)

    def unlisted_queue(self, name: Optional[str]) -> Optional[UnlistedQueue]:
        """The kind of queue `name` is where the profile cannot list it (a reservation or training
        queue), else None."""
        if not name or name in self.queues:
            return None
        return next((kind for kind in self.unlisted_queues if re.fullmatch(kind.pattern, name)), None)

    # NCCL's tuner inputs (GPU generation, CPU vendor, channels, library) for harness.study.prediction.nccl
    nccl: dict[str, Any] = field(default_factory=dict)
    # memory of the device one rank runs on (a GPU, a GCD, a tile): {"device", "gib", "variants":
    # {label: gib} for nodes of another size, "source"}; `harness predict` says which backends fit
    device_memory: dict[str, Any] = field(default_factory=dict)

    def queue(self, name: Optional[str]) -> Optional[Queue]:
        """The queue `name` (or the queue it is an alias of); None where the profile lists no queues,
        no name is given, or the name is one of `unlisted_queues` (limits unknown); UsageError
        naming the known ones otherwise."""
        if not self.queues or not name or self.unlisted_queue(name):
            return None
        found = _by_name_or_alias(self.queues, name)
        if found is None:
            raise unknown_choice(
                f"{self.name} queue", name, [q for q, v in self.queues.items() if not v.execution_only]
            )
        return found

    def qos_limits(self, name: Optional[str]) -> Optional[Queue]:
        """The QOS `name` (-q, or a name it goes by) and its limits; None where the profile lists no
        QOSes (or no name is given); UsageError naming the known ones for another name."""
        if not self.qos or not name:
            return None
        found = _by_name_or_alias(self.qos, name)
        if found is None:
            raise unknown_choice(f"{self.name} QOS", name, self.qos)
        return found

    def submit_name(self, name: str) -> str:
        """The name to submit to for `name` as a job record shows it: the queue or QOS an alias
        belongs to (gpu_regular: regular), else `name` itself."""
        for table in (self.queues, self.qos):
            found = _by_name_or_alias(table, name)
            if found is not None:
                return found.name
        return name

    def execution_queue(self, name: str, nodes: int) -> Optional[Queue]:
        """Where a job of `nodes` submitted to `name` runs: `name` itself, or the routing queue's
        execution queue that takes that many nodes (UsageError when none does)."""
        queue = self.queue(name)
        if queue is None or not queue.routes_to:
            return queue
        for route in queue.routes_to:
            if self.queues[route].accepts(nodes):
                return self.queues[route]
        ranges = ", ".join(f"{r}: {self.queues[r].node_range()}" for r in queue.routes_to)
        raise UsageError(
            f"queue {name} routes jobs of {nodes} node(s) nowhere ({ranges}); "
            "ask for a node count one of them takes, or choose another queue with -q"
        )

    def submit_queue(self, name: str) -> str:
        """The queue to name when submitting again: the routing queue an execution queue belongs to,
        the queue an alias belongs to."""
        name = self.submit_name(name)
        for routing in self.queues.values():
            if name in routing.routes_to:
                return routing.name
        return name

    def scratch_root(self, account: Optional[str], environ: Mapping[str, str]) -> Optional[str]:
        """The directory under which a job's directory goes by default (`job_root`: the site's
        scratch file system), or None where the profile names none or it needs an account or a
        variable this job does not have."""
        template = self.job_root.get("path", "")
        if not template or ("{account" in template and not account):
            return None
        filled = template.replace("{account_lower}", (account or "").lower()).replace("{account}", account or "")
        return expand_path(filled, environ) or None

    def identified_by(self, environ: Mapping[str, str], hostname: str) -> bool:
        """Whether this host is one of the site's (its `identify` patterns)."""
        for key, pattern in self.identify.items():
            value = hostname if key == "hostname" else environ.get(key)
            if value and (re.search(pattern, value) if key == "hostname" else re.fullmatch(pattern, value)):
                return True
        return False

    def storage_for(self, path: str, environ: Mapping[str, str]) -> Optional[Storage]:
        """The longest storage prefix `path` lies under (variables expanded), if any."""
        best: Optional[tuple[int, Storage]] = None
        real = os.path.realpath(path)
        for entry in self.storage:
            prefix = expand_path(entry.path, environ)
            if not prefix:
                continue  # a variable that is not set here ($SCRATCH on a laptop)
            prefix = os.path.realpath(prefix)
            if (real == prefix or real.startswith(prefix.rstrip("/") + "/")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), entry)
        return best[1] if best else None

    def gpu_order_list(self, gpus: int) -> list[int]:
        """The GPU a node's k-th local GPU slot maps to: 0..n-1, or reversed where the CPU binding
        puts low local ranks next to the highest-numbered GPU (Polaris, Perlmutter)."""
        order = list(range(gpus))
        return order[::-1] if self.gpu_order == "reverse" else order

    def launch_template(self, values: Mapping[str, Any], gpus: int, mpi: str, mps: bool) -> str:
        """The site launcher's words for one run, {ranks} {ppn} {nodes} left for the sweep."""
        segments = {
            "gpu_flags": self.gpu_flags if gpus else "",
            "gpu_binding": self.gpu_binding if gpus else "",
            "mpi_flags": "--mpi {mpi}" if mpi else "",
            "mps_wrapper": self.mps.get("wrapper", "") if mps else "",
        }
        text = _PLACEHOLDER.sub(lambda m: segments.get(m[1], m[0]), self.launch)
        filled = {
            **{k: shlex.quote(str(v)) for k, v in values.items()},
            "mpi": shlex.quote(mpi),
            "gpus_per_node": str(gpus),
            "gpu_order": ",".join(map(str, self.gpu_order_list(gpus))),
        }
        text = _PLACEHOLDER.sub(lambda m: filled.get(m[1], m[0]), text)
        return " ".join(text.split())

    def cpu_bind_list(self, ranks: int, depth: int) -> str:
        """mpiexec's `--cpu-bind list:` value for `ranks` per node: the ranks split evenly across the
        sockets (the first half on socket 0, next to the first half of the GPUs), each bound to
        `depth` consecutive cores of its socket, fewer where the socket has not that many."""
        sockets = [_core_range(text, self.name) for text in self.cpu_sockets]
        per_socket = -(-ranks // len(sockets))
        smallest = min(last - first + 1 for first, last in sockets)
        if per_socket > smallest:
            raise UsageError(
                f"{ranks} ranks per node do not fit {self.name}'s {len(sockets)} sockets of {smallest} "
                f"usable cores; pass RANKS_PER_NODE of at most {smallest * len(sockets)}"
            )
        entries = []
        for rank in range(ranks):
            first, last = sockets[rank // per_socket]
            width = max(1, min(depth, (last - first + 1) // per_socket))
            start = first + (rank % per_socket) * width
            entries.append(f"{start}-{start + width - 1}" if width > 1 else str(start))
        return ":".join(entries)

    def mps_command(self, which: str, values: Mapping[str, Any]) -> Optional[list[str]]:
        """The once-per-node MPS `start` or `stop` command (None where each run wraps its ranks)."""
        template = self.mps.get(which)
        if not template:
            return None
        return shlex.split(_PLACEHOLDER.sub(lambda m: shlex.quote(str(values.get(m[1], m[0]))), template))


def _by_name_or_alias(table: Mapping[str, Queue], name: str) -> Optional[Queue]:
    """The entry of `table` called `name`, or the one `name` is an alias of."""
    return table.get(name) or next((entry for entry in table.values() if name in entry.aliases), None)


def expand_path(path: str, environ: Mapping[str, str]) -> str:
    """`path` with $NAME replaced from `environ`; empty when a variable it names is unset."""
    names = re.findall(r"\$(\w+)", path)
    if any(not environ.get(name) for name in names):
        return ""
    return re.sub(r"\$(\w+)", lambda m: environ[m[1]], path)


def _core_range(text: str, site: str) -> tuple[int, int]:
    """A socket's usable cores, "first-last", as two numbers."""
    first, _, last = text.partition("-")
    if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
        raise UsageError(f'site profile {site}: cpu_sockets entry {text!r} is not a core range such as "1-51"')
    return int(first), int(last)


def site_names() -> list[str]:
    """The profiles that come with the kit."""
    return sorted(name[:-5] for name in os.listdir(SITES_DIR) if name.endswith(".json"))


def load_site(name: str) -> SiteProfile:
    """The profile `name` (one of site_names()), or the JSON file at that path."""
    path = name if name.endswith(".json") else os.path.join(SITES_DIR, f"{name}.json")
    if not os.path.isfile(path):
        raise unknown_choice("site", name, [*site_names(), "path/to/site.json"])
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise UsageError(f"site profile {path} cannot be read ({exc}); fix its JSON") from exc
    return profile_from_dict(data, path)


def profile_from_dict(data: dict[str, Any], source: str) -> SiteProfile:
    """A checked SiteProfile from a profile's JSON object; UsageError naming the field at fault."""
    data = dict(data)
    queues = _queue_table("queues", data.pop("queues", {}), source)
    qos = _queue_table("qos", data.pop("qos", {}), source)
    storage = tuple(Storage(**entry) for entry in data.pop("storage", []))
    try:
        plugin = data.pop("network_plugin", None)
        plugin = NetworkPlugin(**{**plugin, "library_path": tuple(plugin.get("library_path", ()))}) if plugin else None
        unlisted = tuple(UnlistedQueue(**entry) for entry in data.pop("unlisted_queues", []))
        profile = SiteProfile(
            network_plugin=plugin,
            unlisted_queues=unlisted,
            queues=queues,
            qos=qos,
            storage=storage,
            backends=tuple(data.pop("backends", ())),
            unsupported_backends=tuple(data.pop("unsupported_backends", ())),
            cpu_sockets=tuple(data.pop("cpu_sockets", ())),
            **data,
        )
    except TypeError as exc:
        raise UsageError(f"site profile {source}: {exc}; see harness/study/sites/generic-slurm.json") from exc
    for what, value, known in (
        ("scheduler", profile.scheduler, SCHEDULERS),
        ("warning", profile.warning, WARNINGS),
        ("gpu_order", profile.gpu_order, GPU_ORDERS),
    ):
        if value not in known:
            raise UsageError(f"site profile {source}: {what} {value!r} is not one of {', '.join(known)}")
    for socket in profile.cpu_sockets:
        _core_range(socket, source)
    for queue in queues.values():
        missing = [route for route in queue.routes_to if route not in queues]
        if missing:
            raise UsageError(f"site profile {source}: queue {queue.name} routes to unknown queues {missing}")
    _check_qos(profile, source)
    _check_device_memory(profile, source)
    _check_aliases(profile, source)
    return profile


def _check_aliases(profile: SiteProfile, source: str) -> None:
    """Each name a queue or QOS goes by means one of them only."""
    for table in (profile.queues, profile.qos):
        owners: dict[str, str] = {}
        for entry in table.values():
            for alias in entry.aliases:
                other = alias if alias in table else owners.get(alias)
                if other is not None:
                    raise UsageError(
                        f"site profile {source}: {entry.name}'s alias {alias} is also {other}'s name or alias; "
                        "give each name one queue"
                    )
                owners[alias] = entry.name


def _check_device_memory(profile: SiteProfile, source: str) -> None:
    """Each device memory a positive number of GiB."""
    facts = profile.device_memory
    if not facts:
        return
    sizes = {"gib": facts.get("gib"), **(facts.get("variants") or {})}
    for label, gib in sizes.items():
        if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not gib > 0:
            raise UsageError(
                f"site profile {source}: device_memory {label} must be a positive number of GiB, got {gib!r}"
            )


def _check_qos(profile: SiteProfile, source: str) -> None:
    """A QOS table only where it adds to partitions, and only with what a QOS limits."""
    if profile.qos and (profile.scheduler, profile.queue_field) != ("slurm", "partition"):
        raise UsageError(
            f'site profile {source}: "qos" describes the QOSes of a Slurm site whose queues are '
            f'partitions (queue_field "partition"); with queue_field {profile.queue_field!r} list them '
            'under "queues"'
        )
    for qos in profile.qos.values():
        # Routing and requeueing are read from the partition: in a QOS entry they would be ignored.
        if qos.routes_to or qos.execution_only or qos.preempt:
            raise UsageError(
                f"site profile {source}: qos {qos.name}: routes_to, execution_only and preempt are "
                "partition fields; give a QOS max_walltime, min_nodes/max_nodes, chaining, "
                "max_running_jobs, note"
            )


def _queue_table(kind: str, table: Any, source: str) -> dict[str, Queue]:
    """A profile's "queues" or "qos" object, {name: {limit: value}}, as Queues by name."""
    if not isinstance(table, dict) or not all(isinstance(spec, dict) for spec in table.values()):
        raise UsageError(
            f'site profile {source}: "{kind}" must map each name to an object of its limits, e.g. '
            '{"debug": {"max_walltime": "02:00:00", "chaining": false}}'
        )
    label = "queue" if kind == "queues" else kind
    return {name: _queue(label, name, spec, source) for name, spec in table.items()}


def _queue(label: str, name: str, spec: dict[str, Any], source: str) -> Queue:
    spec = dict(spec)
    walltime = spec.pop("max_walltime", None)
    try:
        for key, (kind, wanted) in _QUEUE_TYPES.items():
            value = spec.get(key)
            # bool is an int to isinstance: "max_nodes": true must not pass as 1
            if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
                raise UsageError(f"{key} {value!r} is not {wanted}")
        aliases = spec.pop("aliases", [])
        if not isinstance(aliases, list) or not all(isinstance(alias, str) and alias for alias in aliases):
            raise UsageError(f"aliases {aliases!r} is not a list of names")
        return Queue(
            name=name,
            max_walltime_s=None if walltime is None else parse_walltime(walltime, "slurm"),
            routes_to=tuple(spec.pop("routes_to", ())),
            aliases=tuple(aliases),
            **spec,
        )
    except (TypeError, UsageError) as exc:
        raise UsageError(f"site profile {source}: {label} {name}: {exc}") from exc
