"""Where the ranks landed, checked against the study's plan before the sweep.

Discovery (`harness env` on every rank of the allocation, harness.study.jobs.job.discover) reports each
rank's host, rank, local rank and local size and the address and port it will meet the others on.
A plan of N nodes x K ranks is kept only where every node holds exactly K ranks, numbered 0..K-1
locally, and every rank names the same rendezvous: a launcher that put 8 ranks on one host of a
2-node allocation, or ranks told different addresses, would otherwise run for hours on a layout the
records do not describe, or hang at the rendezvous.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Optional


def _node(entry: dict[str, Any]) -> str:
    """A rank's node: its host, and the launcher's node index where it gives one (an emulated cluster
    stands several nodes on one machine, under one hostname)."""
    host = str(entry.get("hostname", "?"))
    return host if entry.get("node_id") is None else f"{host} (node {entry['node_id']})"


def placement_problem(seen: Sequence[dict[str, Any]], nodes: int, per_node: int) -> Optional[str]:
    """One line naming the hosts where the ranks' placement differs from `nodes` x `per_node`, or
    where ranks disagree on the rendezvous address; None when it is as planned."""
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for entry in seen:
        by_node[_node(entry)].append(entry)
    counts = ", ".join(f"{node}: {len(ranks)}" for node, ranks in sorted(by_node.items()))
    if len(by_node) != nodes or any(len(ranks) != per_node for ranks in by_node.values()):
        return (
            f"the ranks landed {counts} rank(s) per host, not the plan's {nodes} node(s) x {per_node}; check "
            "the launcher's placement flags (--ppn, --ntasks-per-node) and RANKS_PER_NODE"
        )
    wrong = [
        node
        for node, ranks in sorted(by_node.items())
        if sorted(entry.get("local_rank", -1) for entry in ranks) != list(range(per_node))
        or {entry.get("local_world_size") for entry in ranks} != {per_node}
    ]
    if wrong:
        return (
            f"the local ranks on {', '.join(wrong)} are not 0..{per_node - 1} of {per_node}; the launcher's "
            "local rank variables disagree with its placement"
        )
    meeting: dict[str, set[str]] = defaultdict(set)
    for entry in seen:
        meeting[f"{entry.get('master_addr')}:{entry.get('master_port')}"].add(_node(entry))
    if len(meeting) > 1:
        shown = "; ".join(f"{where} on {', '.join(sorted(hosts))}" for where, hosts in sorted(meeting.items()))
        return (
            f"the ranks disagree on the rendezvous ({shown}); set one MASTER_ADDR and MASTER_PORT for the "
            "whole job, or unset them so that rank 0's host is found"
        )
    return None
