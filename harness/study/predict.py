"""`harness predict`: step time, throughput and scaling efficiency of data-parallel training on
1..512 nodes of a site, from the compute of one rank and the site's network.

The model, per optimizer step on each of n = nodes x ranks_per_node ranks (weak scaling):
- compute: forward + backward + optimizer of one rank, measured (a run's record at its fewest
  workers) or derived from a published throughput (batch / samples per second);
- the gradient (the model's trainable parameters' bytes) is averaged in buckets of `bucket_bytes`
  (DDP's bucket cap, Horovod's fusion buffer); a bucket becomes ready as the backward produces its
  gradients, spread evenly over the backward (`backward_share` of forward + backward, 2/3 by the
  rule that backward costs twice forward); `overlap` 1 launches each bucket when it is ready (DDP,
  Horovod), 0 only after the whole backward (DeepSpeed ZeRO-0);
- buckets are reduced one after another, each by NCCL's ring allreduce model:
      base + (2(n-1) - 2(N-1)) x alpha_intra + 2(N-1) x alpha_inter + 2(n-1)/n x bytes / busbw(N)
  on N nodes (NCCL's tuning.cc: ring steps inside a node cost the NVLink latency, steps across
  nodes the network's), busbw(N) the NVLink bus bandwidth on one node, else the node's NICs
  together (a ring crosses each node boundary once per channel, and the channels share the NICs);
- step time = compute + fixed overhead (data wait and bookkeeping of the measured run) + the
  communication still running when the backward ends (exposed);
- efficiency = step time of one rank (no communication) / step time on n ranks.
What it leaves out: NCCL picks tree or CollNet algorithms at scale (latency log N, not N), the
network's congestion and the job's placement on the dragonfly, stragglers and jitter (each step
waits for the slowest rank), and compute slowed by communication sharing memory bandwidth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from ..backends.traffic import Collective
from ..errors import UsageError
from ..fileio import atomic_write
from .nccl import Choice
from .stepmodel import BACKWARD_SHARE, step_communication

GB = 1e9
DEFAULT_NODES = tuple(2**k for k in range(10))  # 1 .. 512


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

    def busbw(self, nodes: int) -> float:
        return self.busbw_intra if nodes <= 1 else min(self.busbw_intra, self.busbw_inter)

    def seconds(self, kind: str, size: float, ranks: int, nodes: int) -> Choice:
        """The ring model of this fit for any collective: all_gather and reduce_scatter take half
        the allreduce's steps and bytes (an assumption where `harness bench` measured only allreduce)."""
        seconds = self.allreduce_seconds(size, ranks, nodes)
        return Choice(seconds if kind == "all_reduce" else seconds / 2, "ring (fitted)", "-")

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
    calls: tuple[Collective, ...] = ()  # the backend's traffic; () for allreduce in buckets
    traffic_source: str = "allreduce of the gradients in buckets"
    node_step_s: Optional[float] = None  # a full node's measured step: all but inter-node traffic

    def buckets(self) -> list[int]:
        full, rest = divmod(self.gradient_bytes, self.bucket_bytes)
        return [self.bucket_bytes] * full + ([rest] if rest else [])

    def collectives(self) -> tuple[Collective, ...]:
        """The backend's calls, else the gradient allreduced in buckets (after backward at overlap 0)."""
        if self.calls:
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
            }
        )
    return rows


def network_from_site(name: str) -> Network:
    """The network figures of a site profile's `network` section (harness/study/sites/*.json)."""
    from .sites import load_site

    profile = load_site(name)
    figures: Mapping[str, Any] = getattr(profile, "network", None) or {}
    if not figures:
        raise UsageError(
            f"site {name} has no network figures; give --network BENCH.json from `harness bench "
            "allreduce`, or add a `network` section to its profile"
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


def network_from_bench(
    result: Mapping[str, Any], ranks_per_node: Optional[int] = None, within: Optional[Network] = None
) -> Network:
    """Figures fitted by `harness bench allreduce`: across nodes they are the network's (the node's
    own from `within`, else the same), on one node the node's."""
    fit = result.get("fit")
    if not fit:
        raise UsageError("this benchmark has no fit (one rank); run `harness bench allreduce` on 2 or more ranks")
    alpha, busbw = fit["alpha_s"], fit["busbw_bytes_per_s"]
    across = result.get("nodes", 1) > 1
    source = (
        f"harness bench allreduce, {result['backend']}, {result['world_size']} ranks on {result.get('nodes', 1)} "
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
    )


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
) -> Workload:
    """Compute per step (mean over the runs at the fewest workers), gradient bytes and bucket size
    of measured runs; the bucket is the run's own (bucket_cap_mb, fusion_threshold_mb) unless given."""
    runs = _baseline_runs(records)

    def mean(key: str) -> float:
        return sum(r["step_breakdown"]["seconds_per_step"][key] for r in runs) / len(runs)

    tuning = runs[0].get("tuning", {})
    bucket = bucket_mb or tuning.get("bucket_cap_mb") or tuning.get("fusion_threshold_mb") or 25.0
    if not runs[0].get("gradient_bytes"):
        raise UsageError(
            "these records do not say their gradient bytes (made before this harness recorded them); "
            "give --gradient-bytes or --model"
        )
    return Workload(
        compute_s=mean("forward_backward") + mean("optimizer"),
        backward_s=backward_share * mean("forward_backward"),
        overhead_s=mean("data_wait") + mean("other"),
        gradient_bytes=int(runs[0]["gradient_bytes"]),
        bucket_bytes=int(bucket * 2**20),
        overlap=overlap,
        local_batch=runs[0]["local_batch"],
        source=f"{len(runs)} run(s) of {runs[0]['backend']} x{runs[0]['world_size']}, {runs[0]['model']}",
    )


def model_gradient_bytes(model: str, channels: int = 3, size: int = 224, classes: int = 1000) -> int:
    """Bytes of the trainable float32 parameters of one of the harness's models (ImageNet-shaped by default)."""
    from ..training.models import build_model

    built = build_model(model, channels, size, classes)
    return sum(p.numel() * 4 for p in built.parameters() if p.requires_grad)


def measured_steps(records: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Measured step seconds per rank count (world size): mean, 95% interval, runs, and whether any
    of them ran under contention."""
    from ..training.record import mean_and_ci95

    by_ranks: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        per_step = record.get("step_breakdown", {}).get("seconds_per_step", {})
        if per_step.get("runtime") and record.get("tags", {}).get("baseline") != "all-cores":
            by_ranks.setdefault(record["world_size"], []).append(record)
    return {
        ranks: {
            **mean_and_ci95([r["step_breakdown"]["seconds_per_step"]["runtime"] for r in runs]),
            "contended": any(r.get("contention", {}).get("flagged") for r in runs),
        }
        for ranks, runs in sorted(by_ranks.items())
    }


def prediction_table(rows: Sequence[dict[str, Any]], measured: Optional[Mapping[int, dict[str, Any]]] = None) -> str:
    """Markdown: per node count the prediction, and where measured the measured step and the error."""
    from .report import markdown_table

    columns = [
        ("nodes", lambda r: r["nodes"]),
        ("ranks", lambda r: r["ranks"]),
        ("allreduce ms", lambda r: 1e3 * r["allreduce_s"]),
        ("exposed ms", lambda r: 1e3 * r["exposed_s"]),
        ("step ms", lambda r: 1e3 * r["step_s"]),
        ("samples/s", lambda r: r["throughput"]),
        ("efficiency", lambda r: r["efficiency"]),
    ]
    if measured:
        columns += [
            ("measured step ms", lambda r: _measured(measured, r, lambda m: 1e3 * m["mean"])),
            ("± 95%", lambda r: _measured(measured, r, lambda m: 1e3 * m["ci95"] if m["ci95"] else None)),
            ("error", lambda r: _measured(measured, r, lambda m: f"{r['step_s'] / m['mean'] - 1:+.1%}")),
        ]
    return markdown_table(list(rows), columns)


def _measured(measured: Mapping[int, dict[str, Any]], row: dict[str, Any], get: Any) -> Any:
    found = measured.get(row["ranks"])
    return get(found) if found and found.get("mean") else None


def add_predict_flags(parser: Any) -> None:
    """`harness predict`'s flags."""
    parser.add_argument(
        "--site",
        default=None,
        help="site profile for the network and GPUs per node: polaris, perlmutter (or a profile JSON)",
    )
    parser.add_argument(
        "--network",
        default=None,
        help="network figures fitted by `harness bench allreduce --results FILE` (across nodes: the network's)",
    )
    parser.add_argument(
        "--record",
        nargs="+",
        default=None,
        help="results file(s): compute per step from the runs at the fewest workers",
    )
    parser.add_argument("--throughput", type=float, default=None, help="or: published samples/s of one GPU")
    parser.add_argument("--batch-size", type=int, default=None, help="with --throughput: samples per GPU per step")
    parser.add_argument(
        "--model",
        default=None,
        help="with --throughput: cnn, resnet18 or resnet50 (its gradient bytes, ImageNet-shaped)",
    )
    parser.add_argument(
        "--gradient-bytes",
        type=int,
        default=None,
        help="bytes averaged per step (default: the record's, or --model's)",
    )
    parser.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="gradient bucket in MiB (default: the record's bucket_cap_mb / fusion_threshold_mb, else 25)",
    )
    parser.add_argument(
        "--overlap", type=float, default=1.0, help="0 (after backward) .. 1 (buckets as ready); default 1"
    )
    parser.add_argument("--ranks-per-node", type=int, default=None, help="default: the site's GPUs per node")
    parser.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)), help="node counts (default: 1..512)")
    parser.add_argument(
        "--measured",
        nargs="+",
        default=None,
        help="results file(s) of runs to put beside the prediction (matched by world size)",
    )
    parser.add_argument("--json", default=None, help="write the prediction (and measured steps) as JSON here")
    parser.add_argument("-o", "--output", default=None, help="figure prefix: PREFIX-prediction.{png,svg,json}")


def parse_nodes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; UsageError for anything but positive whole node counts."""
    try:
        nodes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        nodes = []
    if not nodes or min(nodes) < 1:
        raise UsageError(f"--nodes takes positive node counts, e.g. --nodes 1,2,4; got {text!r}")
    return nodes


def _dump(document: Mapping[str, Any], path: str) -> None:
    with open(path, "w") as handle:
        json.dump(document, handle, indent=1, allow_nan=False)


def predict_command(args: Any) -> int:
    """`harness predict`: print the prediction table (and write JSON and figure when asked)."""
    nodes = parse_nodes(args.nodes)
    network, workload = network_and_workload(args)
    rows = predict_scaling(workload, network, nodes)
    measured = None
    if args.measured:
        from ..training.record import read_results

        measured = measured_steps(read_results(args.measured))
    print(
        f"network: {network.source}\ncompute: {workload.source}: {workload.compute_s * 1e3:.2f} ms per step "
        f"(+ {workload.overhead_s * 1e3:.2f} ms overhead), {workload.gradient_bytes / 2**20:.1f} MiB of "
        f"gradients in {len(workload.buckets())} bucket(s), overlap {workload.overlap:g}\n"
    )
    print(prediction_table(rows, measured))
    document = {
        "network": asdict(network),
        "workload": asdict(workload),
        "predicted": rows,
        "measured": {str(k): v for k, v in (measured or {}).items()},
    }
    if args.json:
        atomic_write(args.json, lambda tmp: _dump(document, tmp))
    if args.output:
        from .plot import write_prediction_figure

        for path in write_prediction_figure(rows, measured, f"{network.name}: {workload.source}", args.output):
            print(path)
    return 0


POSITIVE_FLAGS = ("throughput", "batch_size", "gradient_bytes", "bucket_mb", "ranks_per_node")


def check_positive(args: Any) -> None:
    """UsageError for a count or rate given as zero or less (a negative throughput has no prediction)."""
    for name in POSITIVE_FLAGS:
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be positive, got {value:g}; give {flag} a number above zero")


def read_bench(path: str) -> dict[str, Any]:
    """The result file of `harness bench allreduce --results`; UsageError naming the fix when it is
    missing, not JSON, or another kind of file (a results.jsonl of runs, a profile)."""
    fix = "give --network the JSON that `harness bench allreduce --results FILE` wrote"
    try:
        with open(path) as handle:
            result = json.load(handle)
    except FileNotFoundError:
        raise UsageError(f"--network file {path} does not exist; {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, IsADirectoryError):
        raise UsageError(f"--network file {path} is not one JSON document; {fix}") from None
    if not isinstance(result, dict) or result.get("kind") != "allreduce-benchmark":
        raise UsageError(f"--network file {path} is not a benchmark result; {fix}")
    return result


def network_and_workload(args: Any) -> tuple[Network, Workload]:
    """The network (site profile and/or benchmark fit) and workload (records or a published
    throughput) that `harness predict`'s flags name; UsageError naming what is missing."""
    if not args.site and not args.network:
        raise UsageError(
            "name the network: --site polaris (its profile) or --network BENCH.json "
            "(`harness bench allreduce --results`)"
        )
    check_positive(args)
    network = network_from_site(args.site) if args.site else None
    if args.network:
        network = network_from_bench(read_bench(args.network), args.ranks_per_node, within=network)
    assert network is not None
    if args.ranks_per_node:
        network = replace(network, ranks_per_node=args.ranks_per_node)
    if not 0 <= args.overlap <= 1:
        raise UsageError(f"--overlap is a share between 0 and 1, got {args.overlap}")
    bucket = int(args.bucket_mb * 2**20) if args.bucket_mb else None
    if args.record:
        from ..training.record import read_results

        workload = workload_from_records(read_results(args.record), args.overlap, args.bucket_mb)
        if args.gradient_bytes:
            workload = replace(workload, gradient_bytes=args.gradient_bytes)
        return network, workload
    if not (args.throughput and args.batch_size and (args.model or args.gradient_bytes)):
        raise UsageError(
            "give the compute: --record RESULTS.jsonl, or --throughput SAMPLES_PER_S --batch-size N "
            "with --model NAME (or --gradient-bytes N)"
        )
    compute = args.batch_size / args.throughput
    gradient = args.gradient_bytes or model_gradient_bytes(args.model)
    return network, Workload(
        compute_s=compute,
        backward_s=BACKWARD_SHARE * compute,
        overhead_s=0.0,
        gradient_bytes=gradient,
        bucket_bytes=bucket or 25 * 2**20,
        overlap=args.overlap,
        local_batch=args.batch_size,
        source=f"{args.throughput:g} samples/s per GPU at batch {args.batch_size}"
        + (f", {args.model}" if args.model else ""),
    )
