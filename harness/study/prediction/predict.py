"""`harness predict`: step time, throughput and scaling efficiency of data-parallel training on
1..512 nodes of a site, from the compute of one rank (or one node) and the site's network.

The model, per optimizer step on each of n = nodes x ranks_per_node ranks (weak scaling):
- compute: forward + backward + optimizer of one rank, measured (a run's record at its fewest
  workers) or derived from a published throughput (batch / samples per second); a record of one
  full node keeps that node's measured step (its host, input pipeline and intra-node traffic) and
  only the traffic across nodes is added on top;
- traffic: the collectives the backend declares for its options (harness.backends.traffic: DDP's
  buckets, Horovod's fusion, ZeRO 0-3, FSDP with or without reshard-after-forward), with bytes per
  kind as the record measured where it did (step_breakdown.collectives); without a backend, the
  gradient allreduced in buckets of `bucket_bytes`;
- each call priced by NCCL's tuner where the site profile has an `nccl` section (harness.study.prediction.nccl:
  ring or tree, LL, LL128 or Simple, per size and node count), else by `harness bench allreduce`'s
  measured times (one curve per collective measured), read between its sizes: a single alpha-beta
  line through them missed its own points by up to 32% on the shaped links of
  benchmarks/prediction.py, where a link's burst lets small messages through faster than its rate;
  a collective the benchmarks did not time is priced from the all_reduce's figures (a ring's
  half), and `unbenched_lines` says so with the `harness bench` command that would time it;
- the calls laid out on the step's compute (harness.study.prediction.stepmodel): the step waits for what
  compute does not hide;
- efficiency = step time of one rank (no communication) / step time on n ranks.
What it leaves out: CollNet and NVLS, the network's congestion and the job's placement, stragglers
and jitter (each step waits for the slowest rank), compute slowed by communication sharing memory
bandwidth. The CLI is harness.study.prediction.predict_cli.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from ...backends.traffic import Collective, ModelShape, per_step
from ...errors import UsageError
from .allreduce import RING_STEPS
from .nccl import LIBRARY_NOTES, Choice, NcclModel, NcclNetwork
from .stepmodel import BACKWARD_SHARE, step_communication

GB = 1e9
DEFAULT_NODES = tuple(2**k for k in range(10))  # 1 .. 512
UNBENCHED = "‡"  # marks a step that prices a collective no benchmark timed
Curve = tuple[tuple[float, float], ...]  # (bytes, seconds) of one call, by size


def interpolated_seconds(curve: Curve, size: float) -> float:
    """Seconds of one call of `size` bytes on a measured curve: linear between the measured sizes,
    the smallest one's time below them (a latency-bound call costs no less), the last segment's
    slope beyond the largest."""
    points = sorted(curve)
    if size <= points[0][0]:
        return points[0][1]
    if len(points) == 1:
        return points[0][1] * size / points[0][0]
    for (low, low_s), (high, high_s) in zip(points, points[1:]):
        if size <= high:
            return low_s + (high_s - low_s) * (size - low) / (high - low)
    (low, low_s), (high, high_s) = points[-2], points[-1]
    return high_s + (high_s - low_s) * (size - high) / (high - low)


@dataclass(frozen=True)
class Network:
    """The ring-allreduce figures of one site (or of a fitted benchmark), in seconds and bytes/s."""

    name: str
    ranks_per_node: int
    alpha_intra_s: float
    alpha_inter_s: float
    base_latency_s: float
    busbw_intra: float
    busbw_inter: float
    source: str
    # (collective, alpha_s, busbw) fitted by `harness bench allreduce --collective` across nodes
    fits: tuple[tuple[str, float, float], ...] = ()
    # (collective, ranks, across nodes, its measured times): the same benchmarks' own points
    curves: tuple[tuple[str, int, bool, Curve], ...] = ()
    benched: tuple[str, ...] = ()  # the collectives benchmarked (none: a site profile's figures)
    bench_launch: tuple[str, int, int] = ("ddp", 2, 1)  # the benchmarks' backend, ranks and nodes

    def busbw(self, nodes: int) -> float:
        return self.busbw_intra if nodes <= 1 else min(self.busbw_intra, self.busbw_inter)

    def seconds(self, kind: str, size: float, ranks: int, nodes: int) -> Choice:
        """The ring model of this fit for any collective: all_gather and reduce_scatter take half
        the allreduce's steps and bytes (an assumption where `harness bench` measured only allreduce)."""
        if ranks < 2:
            return Choice(0.0, "none", "-")
        for collective, measured_ranks, across, points in self.curves:
            if collective == kind and across == (nodes > 1):
                return self._on_curve(kind, size, ranks, measured_ranks, points)
        for collective, alpha, busbw in self.fits:
            if collective == kind:
                steps = RING_STEPS[kind] * (ranks - 1)
                return Choice(steps * alpha + steps / ranks * size / busbw, f"ring (fitted {kind})", "-")
        seconds = self.allreduce_seconds(size, ranks, nodes)
        if kind == "all_reduce":
            return Choice(seconds, "ring (fitted)", "-")
        return Choice(seconds / 2, "ring (half the all_reduce's)", "-")

    def _on_curve(self, kind: str, size: float, ranks: int, measured_ranks: int, points: Curve) -> Choice:
        """A call priced from the measured curve; at another rank count, its bus bandwidth held
        (nccl-tests' busbw does not depend on the rank count) and the ring's extra latency steps
        priced at the fitted alpha."""
        seconds = interpolated_seconds(points, size)
        if ranks == measured_ranks:
            return Choice(seconds, f"measured {kind}", "-")
        steps = RING_STEPS[kind]
        alpha = next((a for collective, a, _ in self.fits if collective == kind), self.alpha_inter_s)
        scaled = seconds * ((ranks - 1) / ranks) / ((measured_ranks - 1) / measured_ranks)
        extra_latency = steps * (ranks - measured_ranks) * alpha
        return Choice(max(scaled + extra_latency, 0.0), f"measured {kind}, scaled from {measured_ranks} ranks", "-")

    def assumptions(self) -> list[str]:
        """How this network prices a call, printed with every prediction."""
        measured = ", ".join(sorted({kind for kind, *_ in self.curves}))
        lines = [f"{measured} priced from the benchmark's measured times, read between its sizes"] if measured else []
        return lines + ["other collectives priced by a ring alpha-beta model fitted to the benchmark"]

    def allreduce_seconds(self, size: float, ranks: int, nodes: int) -> float:
        """NCCL's ring model for one allreduce of `size` bytes over `ranks` ranks on `nodes` nodes."""
        if ranks < 2:
            return 0.0
        steps, inter_steps = 2 * (ranks - 1), 2 * (max(nodes, 1) - 1)
        return (
            self.base_latency_s
            + (steps - inter_steps) * self.alpha_intra_s
            + inter_steps * self.alpha_inter_s
            + 2 * (ranks - 1) / ranks * size / self.busbw(nodes)
        )


@dataclass(frozen=True)
class Workload:
    """One rank's step: its compute, what it must average, and how much of that can hide."""

    compute_s: float  # forward + backward + optimizer
    backward_s: float  # the part of compute during which gradients appear
    overhead_s: float  # data wait and bookkeeping per step, which communication does not hide
    gradient_bytes: int
    bucket_bytes: int
    overlap: float  # 0: communication starts after backward; 1: each bucket as soon as it is ready
    local_batch: int
    source: str
    calls: Optional[tuple[Collective, ...]] = None  # the backend's traffic; None: allreduce in buckets
    traffic_source: str = "allreduce of the gradients in buckets"
    node_step_s: Optional[float] = None  # a full node's measured step: all but inter-node traffic

    def buckets(self) -> list[int]:
        full, rest = divmod(self.gradient_bytes, self.bucket_bytes)
        return [self.bucket_bytes] * full + ([rest] if rest else [])

    def collectives(self) -> tuple[Collective, ...]:
        """The backend's calls, else the gradient allreduced in buckets (after backward at overlap 0)."""
        if self.calls is not None:
            return self.calls
        phase = "backward_reduce" if self.overlap else "after_backward"
        return tuple(Collective("all_reduce", size, 1, phase, bool(self.overlap)) for size in self.buckets())

    @property
    def forward_s(self) -> float:
        return self.backward_s * (1 - BACKWARD_SHARE) / BACKWARD_SHARE

    @property
    def optimizer_s(self) -> float:
        return max(self.compute_s - self.forward_s - self.backward_s, 0.0)


def communication(workload: Workload, network: Any, ranks: int, nodes: int) -> tuple[float, float]:
    """(seconds of collectives per step, seconds of them not hidden behind compute)."""
    timing = step_communication(
        workload.collectives(),
        lambda call: network.seconds(call.kind, call.bytes, ranks, nodes).seconds,
        workload.forward_s,
        workload.backward_s,
        workload.optimizer_s,
    )
    return timing.total_s, timing.exposed_s


def predict_scaling(
    workload: Workload, network: Network, nodes: Sequence[int] = DEFAULT_NODES
) -> list[dict[str, Any]]:
    """One row per node count: ranks, communication, step time, throughput and efficiency."""
    alone = workload.compute_s + workload.overhead_s
    guessed = unbenched(workload, network)
    node_extra = 0.0
    if workload.node_step_s is not None:  # the node's own traffic and host as measured, not modelled
        node_extra = workload.node_step_s - alone - communication(workload, network, network.ranks_per_node, 1)[1]
    rows = []
    for count in nodes:
        ranks = count * network.ranks_per_node
        total, exposed = communication(workload, network, ranks, count)
        step = alone + exposed + node_extra
        rows.append(
            {
                "nodes": count,
                "ranks": ranks,
                "allreduce_s": total,
                "exposed_s": exposed,
                "step_s": step,
                "throughput": ranks * workload.local_batch / step,
                "efficiency": alone / step,
                "algorithms": picked_algorithms(workload, network, ranks, count),
                **({"unbenched": guessed} if guessed and ranks > 1 else {}),
            }
        )
    return rows


def picked_algorithms(workload: Workload, network: Any, ranks: int, nodes: int) -> str:
    """Which algorithm and protocol each kind of call gets, e.g. 'all_reduce: tree/Simple x4'."""
    picks: dict[str, dict[str, int]] = {}
    for call in workload.collectives():
        choice = network.seconds(call.kind, call.bytes, ranks, nodes)
        if choice.algorithm != "none":
            label = choice.algorithm + (f"/{choice.protocol}" if choice.protocol != "-" else "")
            counts = picks.setdefault(call.kind, {})
            counts[label] = counts.get(label, 0) + call.count
    return "; ".join(
        f"{kind}: " + ", ".join(f"{label} x{count}" for label, count in labels.items())
        for kind, labels in picks.items()
    )


def network_from_site(name: str) -> Any:
    """The network figures of a site profile's `network` section (harness/study/sites/*.json)."""
    from ..sites import load_site

    profile = load_site(name)
    figures: Mapping[str, Any] = getattr(profile, "network", None) or {}
    tuner: Mapping[str, Any] = getattr(profile, "nccl", None) or {}
    if not figures:
        library = LIBRARY_NOTES.get(tuner.get("library", ""), "")
        raise UsageError(
            f"site {name} has no network figures; give --network BENCH.json from `harness bench "
            "allreduce`, or add a `network` section to its profile" + (f" ({library})" if library else "")
        )
    if tuner:
        return NcclNetwork(
            name=profile.name,
            ranks_per_node=max(profile.gpus_per_node, 1),
            model=NcclModel.from_profile(figures, tuner),
            source=f"site profile {profile.name}: {figures.get('source', '')}; {tuner.get('source', '')}",
        )
    efficiency = figures["efficiency"]
    return Network(
        name=profile.name,
        ranks_per_node=max(profile.gpus_per_node, 1),
        alpha_intra_s=figures["alpha_intra_us"] * 1e-6,
        alpha_inter_s=figures["alpha_inter_us"] * 1e-6,
        base_latency_s=figures["base_latency_us"] * 1e-6,
        busbw_intra=figures["intra_node_gbytes_per_s"] * efficiency * GB,
        busbw_inter=figures["nics_per_node"] * figures["nic_gbytes_per_s"] * efficiency * GB,
        source=figures.get("source", f"site profile {profile.name}"),
    )


def network_from_bench(result: Mapping[str, Any], ranks_per_node: Optional[int] = None, within: Any = None) -> Network:
    """Figures fitted by `harness bench allreduce`: across nodes they are the network's (the node's
    own from `within`, else the same), on one node the node's."""
    fit = result.get("fit")
    if not fit:
        raise UsageError("this benchmark has no fit (one rank); run `harness bench allreduce` on 2 or more ranks")
    alpha, busbw = fit["alpha_s"], fit["busbw_bytes_per_s"]
    across = result.get("nodes", 1) > 1
    source = (
        f"harness bench allreduce --collective {result.get('collective', 'all_reduce')}, {result['backend']}, {result['world_size']} ranks on {result.get('nodes', 1)} "
        f"node(s): alpha {alpha * 1e6:.1f} us, busbw {busbw / GB:.3f} GB/s"
    )
    return Network(
        name=result.get("hostname", "benchmark"),
        ranks_per_node=ranks_per_node or (within.ranks_per_node if within else result["ranks_per_node"]),
        alpha_intra_s=within.alpha_intra_s if within and across else alpha,
        alpha_inter_s=alpha,
        base_latency_s=0.0,
        busbw_intra=within.busbw_intra if within and across else busbw,
        busbw_inter=busbw,
        source=source,
        curves=_curves(result),
        benched=(result.get("collective", "all_reduce"),),
        bench_launch=(result["backend"], result["world_size"], result.get("nodes", 1)),
    )


def _curves(result: Mapping[str, Any]) -> tuple[tuple[str, int, bool, Curve], ...]:
    """The benchmark's measured times as the one curve of its collective (none without any)."""
    points = tuple((size["bytes"], size["seconds"]) for size in result.get("sizes", ()) if size.get("seconds"))
    kind, across = result.get("collective", "all_reduce"), result.get("nodes", 1) > 1
    return ((kind, result["world_size"], across, points),) if points else ()


def network_from_benches(
    results: Sequence[Mapping[str, Any]], ranks_per_node: Optional[int] = None, within: Any = None
) -> Network:
    """One network from benchmarks of several collectives: the allreduce's (else the first's) ring
    figures, and each other collective's own fit for its own calls."""
    kinds = [result.get("collective", "all_reduce") for result in results]
    main = results[kinds.index("all_reduce")] if "all_reduce" in kinds else results[0]
    network = network_from_bench(main, ranks_per_node, within)
    curves = tuple(curve for result in results for curve in _curves(result))
    fits = tuple(
        (kind, result["fit"]["alpha_s"], result["fit"]["busbw_bytes_per_s"])
        for kind, result in zip(kinds, results)
        if result.get("fit") and kind != "all_reduce"
    )
    own = "; ".join(f"{kind}: alpha {alpha * 1e6:.1f} us, busbw {busbw / GB:.3f} GB/s" for kind, alpha, busbw in fits)
    source = f"{network.source}; {own}" if fits else network.source
    return replace(network, fits=fits, curves=curves, source=source, benched=tuple(dict.fromkeys(kinds)))


def unbenched(workload: Workload, network: Any) -> list[str]:
    """The kinds of the workload's calls that `harness bench` can time and `network`'s benchmarks did
    not, so that it prices them from another collective's figures (none where the network is not a
    benchmark's)."""
    benched = getattr(network, "benched", ())
    kinds = per_step(workload.collectives())
    return [kind for kind in RING_STEPS if kind in kinds and benched and kind not in benched]


def unbenched_lines(workload: Workload, network: Any) -> list[str]:
    """One warning per collective `unbenched`, with the `harness bench` command that would time it."""
    missing = unbenched(workload, network)
    if not missing:
        return []
    backend, ranks, nodes = network.bench_launch
    local = f" -n {ranks}" if nodes == 1 else ""
    where = "" if nodes == 1 else f" on {nodes} nodes ({ranks} ranks), launched as the other benchmarks were"
    return [
        f"warning: {kind} was not benchmarked; priced from the {', '.join(network.benched)} benchmark's figures "
        f"(steps marked {UNBENCHED}); time it with `harness bench allreduce --backend {backend}{local} "
        f"--collective {kind} --results bench-{kind}.json`{where} and add that file to --network"
        for kind in missing
    ]


def _baseline_runs(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    usable = [
        r
        for r in records
        if r.get("step_breakdown", {}).get("timed_steps") and r.get("tags", {}).get("baseline") != "all-cores"
    ]
    if not usable:
        raise UsageError("no record with a timed window to take compute from; give a `harness sweep` results file")
    fewest = min(r["world_size"] for r in usable)
    return [r for r in usable if r["world_size"] == fewest]


def workload_from_records(
    records: Sequence[dict[str, Any]],
    overlap: float,
    bucket_mb: Optional[float],
    backward_share: float = BACKWARD_SHARE,
    gradient_bytes: Optional[int] = None,
) -> Workload:
    """Compute per step (mean over the runs at the fewest workers), gradient bytes (unless given)
    and bucket size of measured runs; the bucket is the run's own (bucket_cap_mb,
    fusion_threshold_mb) unless given."""
    runs = _baseline_runs(records)

    def mean(key: str) -> float:
        return sum(r["step_breakdown"]["seconds_per_step"][key] for r in runs) / len(runs)

    tuning = runs[0].get("tuning", {})
    bucket = bucket_mb or tuning.get("bucket_cap_mb") or tuning.get("fusion_threshold_mb") or 25.0
    gradient_bytes = gradient_bytes or runs[0].get("gradient_bytes")
    if not gradient_bytes:
        raise UsageError(
            "these records do not say their gradient bytes (made before this harness recorded them); "
            "give --gradient-bytes, or the task (--task SPEC, or --model NAME for the images task)"
        )
    return Workload(
        compute_s=mean("forward_backward") + mean("optimizer"),
        backward_s=backward_share * mean("forward_backward"),
        overhead_s=mean("data_wait") + mean("other"),
        gradient_bytes=int(gradient_bytes),
        bucket_bytes=int(bucket * 2**20),
        overlap=overlap,
        local_batch=runs[0]["local_batch"],
        source=f"{len(runs)} run(s) of {runs[0]['backend']} x{runs[0]['world_size']}, {runs[0]['model']}",
    )


def backend_traffic(
    name: str, options: Mapping[str, Any], shape: ModelShape, on_gpu: bool = True
) -> tuple[Collective, ...]:
    """The collectives of backend `name` with `options` on a model of `shape` (the backend's own declaration)."""
    from ...backends import backend_class

    cls = backend_class(name)
    return tuple(cls(cls.parse_options(options)).traffic(shape, on_gpu))


def scaled_to_measured(calls: Sequence[Collective], measured: Mapping[str, Any]) -> tuple[Collective, ...]:
    """The modelled calls with each kind's bytes scaled to the record's `step_breakdown.collectives`."""
    modelled = per_step(calls)
    return tuple(
        replace(call, bytes=int(call.bytes * measured[call.kind]["bytes"] / modelled[call.kind]["bytes"]))
        if call.kind in measured and modelled[call.kind]["bytes"]
        else call
        for call in calls
    )


def measured_steps(records: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Measured step seconds per rank count (world size): the geometric mean, its 95% interval (None
    below MIN_ROUNDS runs: harness.study.scaling.intervals, the method every table of the kit uses), the
    number of runs, and whether any of them ran under contention."""
    from ..scaling.intervals import geometric_mean, mean_interval

    by_ranks: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        per_step = record.get("step_breakdown", {}).get("seconds_per_step", {})
        if per_step.get("runtime") and record.get("tags", {}).get("baseline") != "all-cores":
            by_ranks.setdefault(record["world_size"], []).append(record)
    steps = {
        ranks: [r["step_breakdown"]["seconds_per_step"]["runtime"] for r in runs] for ranks, runs in by_ranks.items()
    }
    return {
        ranks: {
            "mean": geometric_mean(steps[ranks]),
            "interval": mean_interval(steps[ranks]),
            "n": len(runs),
            "contended": any(r.get("contention", {}).get("flagged") for r in runs),
        }
        for ranks, runs in sorted(by_ranks.items())
    }


def prediction_table(rows: Sequence[dict[str, Any]], measured: Optional[Mapping[int, dict[str, Any]]] = None) -> str:
    """Markdown: per node count the prediction, and where measured the measured step and the error."""
    from ..scaling.report import markdown_table
    from ..scaling.report_notes import cell

    columns = [
        ("nodes", lambda r: r["nodes"]),
        ("ranks", lambda r: r["ranks"]),
        ("allreduce ms", lambda r: 1e3 * r["allreduce_s"]),
        ("exposed ms", lambda r: 1e3 * r["exposed_s"]),
        ("step ms", lambda r: cell(1e3 * r["step_s"]) + (f" {UNBENCHED}" if r.get("unbenched") else "")),
        ("samples/s", lambda r: r["throughput"]),
        ("efficiency", lambda r: r["efficiency"]),
    ]
    if measured:
        columns += [
            ("measured step ms", lambda r: _measured(measured, r, lambda m: 1e3 * m["mean"])),
            ("95% interval", lambda r: _measured(measured, r, lambda m: interval_ms(m["interval"]))),
            ("error", lambda r: _measured(measured, r, lambda m: f"{r['step_s'] / m['mean'] - 1:+.1%}")),
        ]
    columns.append(("algorithm", lambda r: r.get("algorithms") or "-"))
    return markdown_table(list(rows), columns)


def interval_ms(bounds: Optional[Sequence[float]]) -> str:
    """A measured step's 95% interval in milliseconds, '[lower, upper]', or why there is none."""
    from ..scaling.intervals import missing

    return f"[{1e3 * bounds[0]:.1f}, {1e3 * bounds[1]:.1f}]" if bounds else missing()


def _measured(measured: Mapping[int, dict[str, Any]], row: dict[str, Any], get: Any) -> Any:
    found = measured.get(row["ranks"])
    return get(found) if found and found.get("mean") else None
