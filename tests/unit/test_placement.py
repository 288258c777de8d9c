"""The placement a study checks before its sweep: ranks per host as planned, local ranks 0..K-1 of K
on each, one rendezvous for all; otherwise one line naming the hosts."""

from __future__ import annotations

import pytest

from harness.process.discovery import node_id
from harness.study.jobs.placement import placement_problem

pytestmark = pytest.mark.timeout(60)


def ranks(hosts: list[str], per_host: int, addr: str = "node1", port: int = 29500, node_ids: bool = False) -> list:
    """Ranks filling `hosts` in order, `per_host` each, as `harness env` reports them."""
    return [
        {
            "rank": index * per_host + local,
            "hostname": host,
            "local_rank": local,
            "local_world_size": per_host,
            "master_addr": addr,
            "master_port": port,
            "node_id": index if node_ids else None,
        }
        for index, host in enumerate(hosts)
        for local in range(per_host)
    ]


def test_the_planned_placement_passes():
    assert placement_problem(ranks(["node1", "node2"], 4), nodes=2, per_node=4) is None


def test_all_ranks_on_one_host_of_a_two_node_plan_is_named():
    problem = placement_problem(ranks(["node1"], 8), nodes=2, per_node=4)
    assert problem.startswith("the ranks landed node1: 8 rank(s) per host, not the plan's 2 node(s) x 4")


def test_uneven_hosts_are_named_each():
    seen = ranks(["node1"], 3) + ranks(["node2"], 5)
    problem = placement_problem(seen, nodes=2, per_node=4)
    assert "node1: 3, node2: 5" in problem


def test_local_ranks_that_do_not_match_the_placement_are_named():
    seen = ranks(["node1", "node2"], 2)
    seen[3]["local_rank"] = 0  # two local rank 0 on node2: both would take GPU 0
    assert placement_problem(seen, 2, 2).startswith("the local ranks on node2 are not 0..1 of 2")


def test_ranks_that_disagree_on_the_rendezvous_are_named_with_their_hosts():
    seen = ranks(["node1", "node2"], 2)
    seen[3]["master_addr"] = "node2"  # one rank of node2 told another address
    problem = placement_problem(seen, 2, 2)
    assert problem.startswith(
        "the ranks disagree on the rendezvous (node1:29500 on node1, node2; node2:29500 on node2)"
    )


def test_nodes_an_emulated_cluster_stands_on_one_machine_count_by_the_launchers_node_index():
    seen = ranks(["vm", "vm"], 1, node_ids=True)
    assert placement_problem(seen, nodes=2, per_node=1) is None
    assert "vm (node 0): 2" in placement_problem(ranks(["vm"], 2, node_ids=True), nodes=2, per_node=1)


def test_node_index_from_pals_or_slurm():
    assert node_id({"PALS_NODEID": "3"}) == 3 and node_id({"SLURM_NODEID": "1"}) == 1 and node_id({}) is None
