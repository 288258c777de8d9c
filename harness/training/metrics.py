"""Scaling, POP and contention arithmetic: pure functions of measured numbers, no I/O, no torch.

This docstring is the one home of the definitions below; `DEFINITIONS` reads them from it, the
report prints them under every table, and tests check that docs/concepts/measurement.md and notebook 03 say the same.

Definitions (per rank, summed over the steps of the timed window):

- **timed window**: the steps measured, between two barriers, so it spans the slowest rank; the
  first --timing-warmup-steps steps are left out.
- **data wait**: from asking for the next batch until it is on the device.
- **communication**: the time the rank's host was blocked in a collective (exposed), wherever
  in the step: every collective the backend issues (gradient allreduces, ZeRO's and FSDP's
  reduce-scatters and all-gathers, broadcasts) is timed where the backend issues and waits for
  it, in the timed window, and its blocked time is taken out of the phase it happened in. Time in
  flight behind compute is recorded beside it (communication_overlapped), not counted here. A rank
  alone waits for nobody, so its communication is about zero.
- **forward + backward**: from the batch on the device to the averaged gradients being ready
  (Backend.finish_gradient_sync returned), less the communication inside it.
- **optimizer**: the optimizer step after the gradients are averaged, less the communication
  inside it (ZeRO's parameter all-gather).
- **other**: the rest of the window: bookkeeping, the preemption vote, the closing barrier.
- **useful time**: forward + backward + optimizer, the rank's own compute.
- **compute time**: the time a rank works on its batches once they are on the device:
  forward + backward, communication and optimizer (everything DLIO's emulated step stands for).
- **AU** (accelerator utilisation, as DLIO defines it): compute time / total time, summed over
  ranks, where total time is the timed window: the share of the time not lost to waiting for
  data or to bookkeeping between steps. Communication is part of a step's compute here (DLIO
  emulates the whole step as compute), so AU does not count it as lost; the POP metrics do.
- **load balance**: mean over ranks of useful time / max over ranks of useful time.
- **communication efficiency**: max useful time / window.
- **parallel efficiency**: load balance x communication efficiency = mean useful time / window.
- **serialisation and transfer**: POP splits communication efficiency into serialisation (ranks
  waiting for one another) and transfer (data moving) with a replay on an ideal network, which
  this method has not got. Each step's last rank to reach the collective waits only for the
  transfer, so the rank that waited least in total waited at least as long as the transfer
  took: transfer efficiency >= (window - least communication of any rank) / window, and
  serialisation efficiency = communication efficiency / transfer efficiency <= communication
  efficiency / that bound. The split is a pair of bounds, not a measurement; they are exact only
  when one rank is the last to every step's collective and no communication overlaps compute.
- **computation scalability**: across the runs of one configuration, useful time at the study's
  fewest workers / useful time at N: for strong scaling the useful time summed over ranks (the
  same samples are computed at every N), for weak scaling the useful time per rank (each rank
  computes as much at every N), both per step. Below 1: the ranks compute more (more
  instructions, fewer per second) at N than at the baseline for the same work.
- **global efficiency**: parallel efficiency x computation scalability, POP's one number for how
  far a run at N is from perfect scaling of the baseline.
- **speedup**: throughput / the baseline's throughput, where the baseline is the same backend at
  the study's fewest workers with the same work per rank (threads per rank, and for weak scaling
  the batch per rank); never a run with more threads per rank.
- **scaling efficiency**: speedup x baseline workers / workers (1.0 is perfect scaling). For weak
  scaling, above 1.05 is suspect: the baseline was slowed (contention, noise), not the study sped up.
- **contention**: a run is flagged when load from outside the job took its cores: on any node,
  processes that are not the job's used more than 10% of the CPU time of the cores the job may
  use (their busy time in /proc/stat less the job's own processes' CPU time), or the hypervisor
  stole more than 5% of it, or the job's cgroup was throttled for more than 5% of the window.
  The job's own oversubscription (its ranks' compute threads, the backends' helper threads and
  loader workers outnumbering its cores) never flags a run: it is a property of the
  configuration, reported in words beside the verdict.

For weak scaling (fixed batch per worker) the speedup is the throughput ratio by definition; for
strong scaling (fixed global batch) every step processes the same samples, so the throughput ratio
equals the step-time ratio, the classic strong-scaling speedup. One formula serves both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional

from .contention import CLOCK_TICKS


def _definitions(doc: str) -> dict[str, str]:
    """name -> definition text (whitespace collapsed) of the `- **name**: text` items above."""
    block = doc.split("Definitions", 1)[1]
    items = re.findall(r"^- \*\*(.+?)\*\*(.*?)(?=^- \*\*|^\s*$)", block, flags=re.M | re.S)
    return {name: " ".join(f"**{name}**{text}".split()) for name, text in items}


DEFINITIONS: dict[str, str] = _definitions(__doc__ or "")

# AU in a few words, for figure labels and table notes; **AU** above says it in full.
AU_FORMULA = "AU = compute time / total time"

# Contention thresholds (see **contention** above).
OUTSIDE_LOAD_ABOVE = 0.10
STEAL_ABOVE = 0.05
THROTTLED_ABOVE = 0.05
SUSPECT_WEAK_EFFICIENCY = 1.05


def speedup(throughput: float, baseline_throughput: float) -> Optional[float]:
    """How many times the baseline's throughput `throughput` is (None without a positive baseline)."""
    if not baseline_throughput or baseline_throughput <= 0:
        return None
    return throughput / baseline_throughput


def scaling_efficiency(
    throughput: float, workers: int, baseline_throughput: float, baseline_workers: int = 1
) -> Optional[float]:
    """speedup / (workers / baseline_workers): 1.0 when throughput grows in proportion to the workers.

    With a baseline of one worker this is the textbook speedup(N) / N; a larger baseline (e.g. when
    a study starts at one node of 4 GPUs) measures scaling relative to that starting point.
    """
    ratio = speedup(throughput, baseline_throughput)
    if ratio is None or workers <= 0 or baseline_workers <= 0:
        return None
    return ratio * baseline_workers / workers


def load_balance(useful: Sequence[float]) -> Optional[float]:
    """mean(useful) / max(useful) over ranks: 1.0 when every rank computes for as long as the slowest."""
    if not useful or max(useful) <= 0:
        return None
    return sum(useful) / len(useful) / max(useful)


def communication_efficiency(useful: Sequence[float], runtime: float) -> Optional[float]:
    """max(useful) / runtime: the share of the run the busiest rank spends on useful compute."""
    if not useful or runtime <= 0:
        return None
    return max(useful) / runtime


def parallel_efficiency(useful: Sequence[float], runtime: float) -> Optional[float]:
    """load balance x communication efficiency (= mean(useful) / runtime)."""
    balance, communication = load_balance(useful), communication_efficiency(useful, runtime)
    if balance is None or communication is None:
        return None
    return balance * communication


POP_KEYS = (
    "load_balance",
    "communication_efficiency",
    "parallel_efficiency",
    "transfer_efficiency_bound",
    "serialisation_efficiency_bound",
)


def pop_metrics(
    useful: Sequence[float], runtime: float, communication: Optional[Sequence[float]] = None
) -> dict[str, Optional[float]]:
    """The POP multiplicative metrics of one run, keyed as they appear in results records (every
    key None where they cannot be computed); with per-rank `communication`, the bounds of its split
    into transfer and serialisation (see **serialisation and transfer** above)."""
    metrics: dict[str, Optional[float]] = dict.fromkeys(POP_KEYS)
    metrics.update(
        load_balance=load_balance(useful),
        communication_efficiency=communication_efficiency(useful, runtime),
        parallel_efficiency=parallel_efficiency(useful, runtime),
    )
    transfer = transfer_efficiency_bound(communication, runtime) if communication else None
    if transfer and metrics["communication_efficiency"] is not None:
        metrics["transfer_efficiency_bound"] = transfer
        metrics["serialisation_efficiency_bound"] = min(metrics["communication_efficiency"] / transfer, 1.0)
    return metrics


def accelerator_utilisation(compute: float, total: float) -> Optional[float]:
    """AU = compute time / total time; sums over ranks go in (see **AU** above). DLIO computes it
    so (dlio_benchmark, utils/statscounter.py: total_compute_time / total_time)."""
    if total <= 0:
        return None
    return min(max(compute, 0.0) / total, 1.0)


def transfer_efficiency_bound(communication: Sequence[float], runtime: float) -> Optional[float]:
    """The lower bound on POP's transfer efficiency (see **serialisation and transfer** above):
    (window - least communication of any rank) / window."""
    if not communication or runtime <= 0:
        return None
    return max(runtime - min(communication), 0.0) / runtime


def computation_scalability(
    useful_per_step: float, workers: int, baseline_useful_per_step: float, baseline_workers: int, scaling: str
) -> Optional[float]:
    """Useful time at the baseline / useful time at N (see **computation scalability** above);
    `useful_per_step` is the mean over ranks of one rank's useful seconds per step."""
    if useful_per_step <= 0 or baseline_useful_per_step <= 0 or workers <= 0 or baseline_workers <= 0:
        return None
    if scaling == "strong":
        return baseline_useful_per_step * baseline_workers / (useful_per_step * workers)
    return baseline_useful_per_step / useful_per_step


def global_efficiency(parallel: Optional[float], scalability: Optional[float]) -> Optional[float]:
    """parallel efficiency x computation scalability (see **global efficiency** above)."""
    return None if parallel is None or scalability is None else parallel * scalability


def rank_breakdown(
    runtime: float, data_wait: float, forward_backward: float, communication: float, optimizer: float
) -> dict[str, float]:
    """One rank's timed window (seconds, totals over its steps) as STEP_COLUMNS plus `useful`.

    `other` is what the measured phases leave of the window (never negative: the phases are
    measured inside it, so only clock granularity could make it so).
    """
    return {
        "runtime": runtime,
        "data_wait": data_wait,
        "forward_backward": forward_backward,
        "communication": communication,
        "optimizer": optimizer,
        "other": max(runtime - data_wait - forward_backward - communication - optimizer, 0.0),
        "useful": forward_backward + optimizer,
    }


def contention_reasons(
    outside_share: Optional[float], steal: Optional[float], throttled: Optional[float]
) -> list[str]:
    """Why a run counts as measured under contention (empty: it does not); see **contention** above.

    `outside_share` is the largest share, over nodes, of the job's cores' CPU time that other
    processes used; `steal` the share stolen by the hypervisor; `throttled` the largest share of a
    rank's window its cgroup was throttled (None where not measured)."""
    reasons = []
    if outside_share is not None and outside_share > OUTSIDE_LOAD_ABOVE:
        reasons.append(
            f"other processes used {outside_share:.0%} of the CPU time of the job's cores (> {OUTSIDE_LOAD_ABOVE:.0%})"
        )
    if steal is not None and steal > STEAL_ABOVE:
        reasons.append(f"{steal:.0%} of the CPU time was stolen by the hypervisor (> {STEAL_ABOVE:.0%})")
    if throttled is not None and throttled > THROTTLED_ABOVE:
        reasons.append(f"the job's cgroup was throttled {throttled:.0%} of the window (> {THROTTLED_ABOVE:.0%})")
    return reasons


Ranks = Sequence[Optional[float]]


def _node_load(per_rank: Mapping[str, Ranks], ranks: list[int]) -> dict[str, Optional[float]]:
    """One node's outside load and own demand; ranks sharing a CPU set read the same counters, so
    each distinct set counts once (sets that partly overlap count as disjoint: an overestimate)."""
    sets: dict[Optional[float], list[int]] = {}
    for rank in ranks:
        sets.setdefault(per_rank["cpus_key"][rank], []).append(rank)

    def per_set(name: str) -> Optional[float]:
        means = []
        for members in sets.values():
            values = [per_rank[name][rank] for rank in members if per_rank[name][rank] is not None]
            if not values:
                return None
            means.append(sum(values) / len(values))
        return sum(means)

    busy, cpu, steal, cores = (
        per_set(name) for name in ("busy_seconds", "cpu_seconds", "steal_seconds", "usable_cores")
    )
    own = [per_rank["own_seconds"][rank] for rank in ranks]
    demand = [per_rank["demand_per_rank"][rank] for rank in ranks]
    outside, unmeasured = None, None
    if busy is not None and cpu and None not in own:
        # /proc counts CPU time in clock ticks (10 ms on Linux): each core's busy time and each
        # rank's own time is known to a tick at each end of the window. Where that leaves the share
        # uncertain by more than half the threshold (under ~0.6 s on 2 cores), it is not measured.
        cpus = sum(per_rank["cpus"][members[0]] or 0 for members in sets.values())
        uncertainty = 2 * (cpus + len(ranks)) / CLOCK_TICKS / cpu
        if uncertainty > OUTSIDE_LOAD_ABOVE / 2:
            unmeasured = (
                f"the window held {cpu:.2f} CPU seconds of the job's cores: /proc's {1e3 / CLOCK_TICKS:g} ms ticks "
                f"leave the outside share uncertain by {uncertainty:.0%}"
            )
        else:
            outside = max(busy - sum(own), 0.0) / cpu  # type: ignore[arg-type]
    return {
        "ranks": len(ranks),
        "outside_cpu_share": outside,
        "outside_unmeasured": unmeasured,
        "steal_share": steal / cpu if steal is not None and cpu else None,
        "usable_cores": cores,
        "threads_demanded": None if None in demand else sum(demand),  # type: ignore[arg-type]
    }


def _oversubscription(nodes: Sequence[Mapping[str, Any]], demand_words: str) -> str:
    """The job's own demand for cores against the cores it may use, in words."""
    busiest = max(nodes, key=lambda node: (node["threads_demanded"] or 0) / (node["usable_cores"] or 1))
    demanded, cores = busiest["threads_demanded"], busiest["usable_cores"]
    if demanded is None or not cores:
        return "not known: the job's threads or usable cores were not measured"
    what = f"{busiest['ranks']} rank(s) x ({demand_words}) = {demanded:g} threads on {cores:g} usable core(s)"
    if demanded > cores:
        return (
            f"{what}: the configuration oversubscribes its cores {demanded / cores:.1f}x, so its own threads "
            "wait for one another (a property of the configuration, not contention)"
        )
    return f"{what}: the configuration fits its cores"


def contention_summary(per_rank: Mapping[str, Ranks], demand_words: str = "") -> dict[str, Any]:
    """A record's `contention` section from every rank's measures (harness.training.contention's
    CpuMeter.FIELDS, None where not measured): the outside load per node, the job's own
    oversubscription in words, whether the run is flagged and why."""
    nodes: dict[Optional[float], list[int]] = {}
    for rank, node in enumerate(per_rank["node_key"]):
        nodes.setdefault(node, []).append(rank)
    loads = [_node_load(per_rank, ranks) for ranks in nodes.values()]
    outside = [load["outside_cpu_share"] for load in loads if load["outside_cpu_share"] is not None]
    steals = [load["steal_share"] for load in loads if load["steal_share"] is not None]
    throttled = [
        t / w for t, w in zip(per_rank["throttled_seconds"], per_rank["window_seconds"]) if t is not None and w
    ]
    pressure = [p / w for p, w in zip(per_rank["pressure_seconds"], per_rank["window_seconds"]) if p is not None and w]
    verdict = {
        "outside_cpu_share": max(outside) if outside else None,
        "steal_share": max(steals) if steals else None,
        "throttled_share": max(throttled) if throttled else None,
    }
    reasons = contention_reasons(verdict["outside_cpu_share"], verdict["steal_share"], verdict["throttled_share"])
    return {
        **verdict,
        "cpu_pressure_share": max(pressure) if pressure else None,
        "nodes": loads,
        "oversubscription": _oversubscription(loads, demand_words),
        "own_evidence": {name: list(per_rank[name]) for name in ("cpu_share", "runqueue_wait_share", "load_average")},
        "flagged": bool(reasons),
        "reasons": reasons,
        "thresholds": {
            "outside_load_above": OUTSIDE_LOAD_ABOVE,
            "steal_above": STEAL_ABOVE,
            "throttled_above": THROTTLED_ABOVE,
        },
    }


def suspect_weak_efficiency(
    efficiency: Optional[float],
    baseline_contended: bool,
    row_contended: bool,
    baseline_ci95: Optional[float],
    baseline_throughput: float,
) -> Optional[str]:
    """Why a weak-scaling efficiency above SUSPECT_WEAK_EFFICIENCY cannot be taken at face value
    (None when it is not above): the likeliest cause, from what the records say."""
    if efficiency is None or efficiency <= SUSPECT_WEAK_EFFICIENCY:
        return None
    if baseline_contended:
        return "its baseline ran under contention, so it is too slow"
    if baseline_ci95 is None:
        return "its baseline is one run: no interval shows how far it may be off"
    if baseline_throughput and baseline_ci95 / baseline_throughput > efficiency - 1:
        return "within the baseline's run-to-run spread (its 95% interval)"
    if row_contended:
        return "runs at both sizes were contended differently"
    return "the baseline ran slower per rank than this run: check what else ran then"
