"""`harness recommend`: which backend to train a task with at each node count of a site, and why.

For every backend case harness.study.prediction.memory.backend_cases lists (DDP, Horovod, DeepSpeed ZeRO 0-3,
FSDP resharding or kept gathered; or the one --backend names), at every node count: the memory a
rank holds (harness.backends.memory, as `harness predict` prints it) against a capacity (the site
profile's device memory, or --memory-cap), and the step time and throughput of `harness predict`'s
model with that case's own traffic (harness.study.prediction.predict). The choice at a node count is the
fastest case that fits; where others that fit are predicted within the prediction's own
uncertainty (TIE_SHARE) of it, the prediction cannot rank them, so they are named together and one
is taken by a rule that does not rest on the predicted times (TIE_RULE). When no case fits at any
node count, a UsageError names the fix, computed from the figures. The CLI's flags are `harness
predict`'s (harness.study.prediction.predict_cli) and --memory-cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from ...backends.memory import GIB, Activations, MemoryPrediction, Training, backend_label, predict_memory
from ...backends.traffic import ModelShape, per_step
from ...errors import UsageError
from ...fileio import atomic_write_json
from .allreduce import RING_STEPS
from .memory import backend_cases, device_memory, memory_rows, task_activations
from .predict import Workload, predict_scaling, unbenched_lines
from .predict_cli import (
    add_predict_flags,
    anchor_lines,
    backend_options,
    flag_training,
    given_records,
    input_lines,
    memory_task,
    network_and_workload,
    parse_nodes,
    prediction_assumptions,
    traffic_line,
    with_node_and_traffic,
)

# The prediction's stated uncertainty: the kit's held-out benchmark (benchmarks/prediction.py)
# accepts a 2-node prediction within 15% of the measured step. Two cases predicted closer than this
# are not told apart by the model, so neither is presented as the faster.
TIE_SHARE = 0.15
# Among cases within TIE_SHARE of the fastest, the one moving the fewest bytes on the wire per rank
# per step (a ring's all_reduce sends its buffer twice, all_gather and reduce_scatter once): what the
# model leaves out (congestion, placement, stragglers, a network slower than the profile says) costs
# a case in proportion to its traffic, so the least traffic is the safest bet when the predicted
# times cannot decide. Between equal bytes, the least sharded (backend_cases' order: DDP, Horovod,
# ZeRO 0 to 3, FSDP): it runs the fewest collectives a step and keeps whole weights to inspect.
TIE_RULE = (
    f"within {TIE_SHARE:.0%} of the fastest that fits, the predicted steps are not told apart; of those, the "
    "case moving the fewest bytes per rank per step is chosen (a ring's all_reduce sends its buffer twice, "
    "all_gather and reduce_scatter once: the traffic is what the left-out congestion, placement and "
    "stragglers slow down), then the least sharded (in the order DDP, Horovod, ZeRO 0 to 3, FSDP)"
)
SEARCH_NODES = 2**14  # the most nodes the fix for a task too large anywhere looks up to


@dataclass(frozen=True)
class Capacity:
    """The memory a rank may hold: `bytes`, what it is (`label`) and where the figure comes from."""

    bytes: int
    label: str
    source: str


@dataclass(frozen=True)
class Choice:
    """The choice at one node count: the case taken (None where none fits), the cases that fit
    within TIE_SHARE of the fastest (in TIE_RULE's order: not a ranking), and the line printed."""

    nodes: int
    backend: Optional[str]
    tied: tuple[str, ...]
    line: str


@dataclass(frozen=True)
class Recommendation:
    """What `recommend` found: one row per case and node count, a choice per node count, the inputs
    and every assumption (each a printed line), and warnings (collectives no benchmark timed)."""

    rows: tuple[dict[str, Any], ...]
    choices: tuple[Choice, ...]
    inputs: tuple[str, ...]
    assumptions: tuple[str, ...]
    capacity: Capacity
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """As --json writes it."""
        return {**asdict(self), "tie_share": TIE_SHARE, "tie_rule": TIE_RULE}


def wire_bytes(workload: Workload) -> int:
    """Bytes one rank sends per step over the workload's collectives, up to the ring's (n-1)/n
    factor that every case shares: RING_STEPS (2 for all_reduce, 1 for all_gather and reduce_scatter)
    times each call's buffer."""
    return sum(RING_STEPS.get(kind, 1) * kinds["bytes"] for kind, kinds in per_step(workload.collectives()).items())


def record_label(records: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The case the records' baseline runs trained (e.g. 'deepspeed zero_stage=3'), None without
    records or where the recorded options are not this version's."""
    from ...backends import backend_class

    if not records:
        return None
    fewest = min(record.get("world_size", 1) for record in records)
    first = next(record for record in records if record.get("world_size", 1) == fewest)
    try:
        cls = backend_class(first["backend"])
        return backend_label(first["backend"], cls.parse_options(first.get("config", {}).get("backend_options", {})))
    except (KeyError, UsageError):
        return None


def case_rows(
    network: Any,
    workload: Workload,
    name: str,
    options: Any,
    shape: ModelShape,
    per_size: Sequence[MemoryPrediction],
    nodes: Sequence[int],
    capacity: Capacity,
    records: Sequence[Mapping[str, Any]],
) -> tuple[Workload, list[dict[str, Any]]]:
    """One case's workload (its own traffic on `shape`; the records' measurements only where they
    are this case's) and its rows: memory per rank and whether it fits, step time and throughput."""
    label = backend_label(name, options)
    own = list(records) if records and record_label(records) == label else []
    traffic = with_node_and_traffic(workload, own, network.ranks_per_node, name, options.as_dict(), shape)
    sent, calls = wire_bytes(traffic), sum(c["count"] for c in per_step(traffic.collectives()).values())
    rows = []
    for predicted, memory in zip(predict_scaling(traffic, network, nodes), per_size):
        rows.append(
            {
                "backend": label,
                "nodes": predicted["nodes"],
                "ranks": predicted["ranks"],
                "memory_bytes": memory.total(),
                "fits": memory.total() <= capacity.bytes,
                "step_s": predicted["step_s"],
                "throughput": predicted["throughput"],
                "exposed_s": predicted["exposed_s"],
                "communication_s": predicted["allreduce_s"],
                "wire_bytes": sent,
                "calls": calls,
                "unbenched": bool(predicted.get("unbenched")),
                # the parts (the assumptions are the Recommendation's, once)
                "memory": {key: value for key, value in memory.as_dict().items() if key != "assumptions"},
            }
        )
    return traffic, rows


def choose(rows: Sequence[dict[str, Any]], capacity: Capacity) -> Choice:
    """The choice among the rows of one node count (in backend_cases' order): TIE_SHARE, TIE_RULE."""
    count = rows[0]["nodes"]
    where = f"{count} node{'s' if count > 1 else ''}"
    fitting = [row for row in rows if row["fits"]]
    if not fitting:
        least = min(rows, key=lambda row: row["memory_bytes"])
        line = (
            f"{where}: none fits {capacity.label}; the least, {least['backend']}, needs "
            f"{least['memory_bytes'] / GIB:.1f} GiB a rank"
        )
        return Choice(count, None, (), line)
    fastest = min(fitting, key=lambda row: row["step_s"])
    near = [row for row in fitting if row["step_s"] <= fastest["step_s"] * (1 + TIE_SHARE)]
    near.sort(key=lambda row: (row["wire_bytes"], rows.index(row)))  # TIE_RULE
    chosen = near[0]
    figures = f"{1e3 * chosen['step_s']:,.1f} ms a step, {chosen['throughput']:,.0f} samples/s"
    if len(near) > 1:
        steps = [1e3 * row["step_s"] for row in near]
        level = sum(row["wire_bytes"] == chosen["wire_bytes"] for row in near) > 1  # then the least sharded
        line = (
            f"{where}: {', '.join(row['backend'] for row in near)} within {TIE_SHARE:.0%} of the fastest "
            f"({min(steps):,.1f} to {max(steps):,.1f} ms a step): any of them; {chosen['backend']} chosen by the "
            f"tie rule, for the least traffic ({chosen['wire_bytes'] / 2**20:,.1f} MiB a step)"
            + (", then the least sharding" if level else "")
            + f" ({figures})"
        )
    else:
        rest = sorted((row for row in fitting if row is not chosen), key=lambda row: row["step_s"])
        after = (
            f"; the next that fits, {rest[0]['backend']}, is {rest[0]['step_s'] / chosen['step_s'] - 1:.0%} slower"
            if rest
            else "; the only case that fits"
        )
        line = f"{where}: {chosen['backend']} ({figures}){after}"
    return Choice(count, chosen["backend"], tuple(row["backend"] for row in near), line + _faster_unfit(rows, chosen))


def _faster_unfit(rows: Sequence[dict[str, Any]], chosen: dict[str, Any]) -> str:
    """Where a case that does not fit is predicted faster than the choice beyond TIE_SHARE: which,
    and what it needs (the reason it is not chosen)."""
    faster = [row for row in rows if not row["fits"] and row["step_s"] * (1 + TIE_SHARE) < chosen["step_s"]]
    if not faster:
        return ""
    best = min(faster, key=lambda row: row["step_s"])
    return f" ({best['backend']} would be faster but needs {best['memory_bytes'] / GIB:.1f} GiB a rank)"


def too_large(
    shape: ModelShape,
    cases: Sequence[tuple[str, Any]],
    training: Training,
    activations: Activations,
    nodes: Sequence[int],
    ranks_per_node: int,
    capacity: Capacity,
) -> UsageError:
    """The one-line error when no case fits at any node count, with the fixes the figures allow:
    the node count from which a case would fit, the micro-batch that would fit, bf16."""
    largest = max(nodes)  # sharded state shrinks with the ranks: the most nodes hold the least
    least = min(_each(shape, cases, training, activations, largest * ranks_per_node), key=lambda p: p.total())
    fixes = []
    more = largest * 2
    while more <= SEARCH_NODES and not _fits_any(shape, cases, training, activations, more * ranks_per_node, capacity):
        more *= 2
    if more <= SEARCH_NODES:
        fixes.append(f"use {more} nodes or more (--nodes)")
    room = capacity.bytes - (least.total() - least.total("activations")) - activations.fixed
    batch = math.floor(room / activations.per_sample) if activations.per_sample > 0 else 0
    if 1 <= batch < training.micro_batch:
        fixes.append(f"a micro-batch of {batch} or less (--batch-size)")
    if training.precision == "fp32":
        fixes.append("--precision bf16 (smaller activations)")
    fixes.append("a smaller model")
    return UsageError(
        f"no backend fits: the task needs {least.total() / GIB:.1f} GiB a rank even under {least.backend} "
        f"(the least) at {largest} node{'s' if largest > 1 else ''}; {capacity.label} holds "
        f"{capacity.bytes / GIB:.1f} GiB: " + ", ".join(fixes[:-1]) + (" or " if fixes[:-1] else "") + fixes[-1]
    )


def _each(
    shape: ModelShape, cases: Sequence[tuple[str, Any]], training: Training, activations: Activations, ranks: int
) -> list[MemoryPrediction]:
    return [
        predict_memory(shape, name, opts, replace(training, world_size=ranks), activations) for name, opts in cases
    ]


def _fits_any(
    shape: ModelShape,
    cases: Sequence[tuple[str, Any]],
    training: Training,
    activations: Activations,
    ranks: int,
    capacity: Capacity,
) -> bool:
    return any(p.total() <= capacity.bytes for p in _each(shape, cases, training, activations, ranks))


def recommend(
    network: Any,
    workload: Workload,
    task: str,
    task_args: Mapping[str, Any],
    training: Training,
    capacity: Capacity,
    nodes: Sequence[int],
    cases: Optional[Sequence[tuple[str, Any]]] = None,
    records: Sequence[Mapping[str, Any]] = (),
) -> Recommendation:
    """The backend case to train task `task` (with `task_args`, as `training` says) with at each of
    `nodes` nodes of `network` (harness.study.prediction.predict: a site's or a benchmark's) on the compute of
    `workload`: every case of `cases` (default: backend_cases' every distributed one, as (name,
    Options or their values)) with its memory per rank against `capacity` and its predicted step.
    `records`: the runs `workload` was measured from, whose bytes and node step count for their own
    case only. UsageError naming the fix where no case fits at any node count."""
    from ...backends import backend_class
    from .shapes import task_shape

    nodes = list(dict.fromkeys(nodes))
    listed = backend_cases(None, {}) if cases is None else cases
    cases = [(name, backend_class(name).parse_options(o) if isinstance(o, Mapping) else o) for name, o in listed]
    shape = task_shape(task, task_args)
    activations = task_activations(task, task_args, training.precision)
    ranks_per_node = network.ranks_per_node
    memory = memory_rows(shape, cases, training, activations, [count * ranks_per_node for count in nodes])
    if not any(prediction.total() <= capacity.bytes for _, per_size in memory for prediction in per_size):
        raise too_large(shape, cases, training, activations, nodes, ranks_per_node, capacity)
    workloads, rows = [], []
    for (name, options), (_, per_size) in zip(cases, memory):
        traffic, found = case_rows(network, workload, name, options, shape, per_size, nodes, capacity, records)
        workloads.append(traffic)
        rows += found
    rows.sort(key=lambda row: nodes.index(row["nodes"]))  # stable: each node count's cases in their order
    choices = [choose([row for row in rows if row["nodes"] == count], capacity) for count in nodes]
    inputs = [
        *input_lines(network, workload),
        f"task: {' '.join([task, *(f'{k}={v}' for k, v in sorted(task_args.items()))])}: "
        f"{shape.parameter_bytes / 4:,.0f} float32 parameters ({shape.parameter_bytes / GIB:.2f} GiB)",
        f"training: {training.precision}, {training.optimizer}, micro-batch {training.micro_batch}, "
        f"{ranks_per_node} rank(s) per node",
        f"capacity per rank: {capacity.label} ({capacity.source})",
    ]
    warnings = dict.fromkeys(line for traffic in workloads for line in unbenched_lines(traffic, network))
    return Recommendation(
        tuple(rows),
        tuple(choices),
        tuple(inputs),
        tuple(_assumptions(network, workloads, memory, capacity, record_label(records))),
        capacity,
        tuple(warnings),
    )


def _assumptions(
    network: Any,
    workloads: Sequence[Workload],
    memory: Sequence[tuple[MemoryPrediction, list[MemoryPrediction]]],
    capacity: Capacity,
    measured: Optional[str],
) -> list[str]:
    """Every assumption, one line each: the network's and the compute's, each case's traffic, the
    memory rules', the capacity's, the records' (whose case they measured) and the tie rule."""
    lines = [line for traffic in workloads for line in prediction_assumptions(network, traffic)]
    lines += [traffic_line(traffic) for traffic in workloads]
    lines += [line for first, _ in memory for line in first.assumptions]
    lines.append(
        f"fits: a rank's predicted total is at most {capacity.bytes / GIB:.1f} GiB; what the memory rule leaves "
        "out (above) is not reserved, so a case within a GiB or so of the capacity may not fit (on a CPU, the "
        "process's own runtime counts against the cap too)"
    )
    if measured:
        lines.append(
            f"the records ran {measured}: its bytes per kind and a full node's step as measured; every other case "
            "modelled from its options on the same compute"
        )
    return [*dict.fromkeys(lines), TIE_RULE]


def recommendation_lines(found: Recommendation) -> list[str]:
    """What `harness recommend` prints: inputs, warnings, assumptions, the table and the choices."""
    from ..scaling.report import markdown_table
    from ..scaling.report_notes import cell
    from .predict import UNBENCHED

    columns = [
        ("nodes", lambda row: row["nodes"]),
        ("backend", lambda row: row["backend"]),
        ("GiB per rank", lambda row: row["memory_bytes"] / GIB),
        (f"fits {capacity_words(found.capacity)}", lambda row: "yes" if row["fits"] else "no"),
        ("step ms", lambda row: cell(1e3 * row["step_s"]) + (f" {UNBENCHED}" if row["unbenched"] else "")),
        ("samples/s", lambda row: row["throughput"]),
    ]
    return [
        *found.inputs,
        *found.warnings,
        "assumptions:",
        *(f"  - {line}" for line in found.assumptions),
        "",
        markdown_table(list(found.rows), columns),
        "",
        "choice per node count:",
        *(f"  {choice.line}" for choice in found.choices),
    ]


def capacity_words(capacity: Capacity) -> str:
    """The capacity in a table header, e.g. '40 GiB'."""
    return f"{capacity.bytes / GIB:g} GiB"


def add_recommend_flags(parser: Any) -> None:
    """`harness recommend`'s flags: `harness predict`'s, and --memory-cap."""
    add_predict_flags(parser)
    parser.add_argument(
        "--memory-cap",
        type=float,
        default=None,
        metavar="GIB",
        help="memory a rank may hold, in GiB, instead of the site's device memory (e.g. a laptop's CPU ranks)",
    )


def flag_capacity(args: Any) -> Capacity:
    """The capacity the flags name: --memory-cap, else the --site profile's device memory (its
    nodes' device; other node sizes named for --memory-cap); UsageError naming the fix otherwise."""
    from ..sites import load_site

    cap = getattr(args, "memory_cap", None)
    if cap is not None:
        if not (cap > 0 and math.isfinite(cap)):
            raise UsageError(
                f"--memory-cap must be a positive number of GiB a rank, got {cap:g}; e.g. --memory-cap 16"
            )
        return Capacity(int(cap * GIB), f"--memory-cap {cap:g} GiB", "given with --memory-cap")
    devices = device_memory(load_site(args.site)) if args.site else []
    if not devices:
        raise UsageError(
            "no memory to fit against: give --memory-cap GIB (what a rank may hold), or a --site whose profile "
            "has device_memory"
        )
    (label, size), others = devices[0], devices[1:]
    source = load_site(args.site).device_memory.get("source", f"site profile {args.site}")
    also = "; ".join(f"{name}: --memory-cap {other / GIB:g}" for name, other in others)
    return Capacity(size, label, source + (f"; other nodes of the site: {also}" if also else ""))


def site_unsupported(site: str) -> tuple[str, ...]:
    """The backends the profile of `site` says its software cannot run (Horovod on Aurora's XPUs)."""
    from ..sites import load_site

    return tuple(load_site(site).unsupported_backends)


def recommend_command(args: Any) -> int:
    """`harness recommend`: print the recommendation (and write it as JSON when asked)."""
    for flag, given in (("--measured", args.measured), ("-o", args.output)):
        if given:
            raise UsageError(f"{flag} is `harness predict`'s; run `harness predict --backend NAME {flag} ...` for it")
    nodes = parse_nodes(args.nodes)
    capacity = flag_capacity(args)
    network, workload = network_and_workload(args)
    records = given_records(args)
    named = memory_task(args, records)
    if named is None:
        raise UsageError(
            "name the task whose memory decides what fits: --task SPEC (--task-arg KEY=VALUE), --model NAME "
            "for the images task, or --record RESULTS of its runs"
        )
    training = flag_training(args, records, workload.local_batch)
    cases = backend_cases(args.backend, backend_options(args.backend_option)) if args.backend else None
    unsupported = site_unsupported(args.site) if args.site and not args.backend else ()
    if unsupported:  # what the site's software cannot run is never a choice there
        cases = [case for case in backend_cases(None, {}) if case[0] not in unsupported]
    found = recommend(network, workload, named[0], named[1], training, capacity, nodes, cases, records)
    if unsupported:
        left_out = f"left out: {', '.join(unsupported)}, which the site's software cannot run (its profile)"
        found = replace(found, assumptions=(*found.assumptions, left_out))
    print("\n".join(recommendation_lines(found)))
    if any("published anchors" in line for line in found.assumptions):
        print("\n" + "\n".join(anchor_lines()))
    if args.json:
        atomic_write_json(args.json, found.as_dict())
    return 0
