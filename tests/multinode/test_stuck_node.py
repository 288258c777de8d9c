"""The node that holds the heartbeat store goes silent: the survivors still name it.

test_across_nodes.py pulls node 2's link and checks that node 1's survivors name node 2's ranks from
their heartbeats. Here node 1, rank 0's node, where the heartbeat store runs (harness.process.heartbeat),
is cut off: the store's silence is the evidence, and node 2's survivors name node 1 in their line.
The launcher is one that runs on each node (torchrun), so node 2's output reaches the test with
node 1 gone; the backend is the registry's first that runs under it.
"""

from __future__ import annotations

import pytest

from harness.backends import BACKENDS

from .jobs import RANKS_PER_NODE
from .test_across_nodes import SLACK_S, TIMEOUT_S, _cut_node_off_mid_run

LAUNCHER = "torchrun"
BACKEND = next(
    name for name, cls in BACKENDS.items() if cls.max_world_size is None and LAUNCHER in cls.local_launchers
)


@pytest.mark.slow
def test_a_silenced_store_node_is_named_by_the_survivors(cluster):
    job = _cut_node_off_mid_run(cluster, BACKEND, LAUNCHER, node=1)
    statuses = job.wait(TIMEOUT_S + SLACK_S + 60, nodes=[2])
    tail = job.tail()
    assert statuses is not None, f"{BACKEND} via {LAUNCHER}: node 2 still ran long after node 1 was lost\n{tail}"
    assert all(status != 0 for status in statuses), tail
    assert job.seconds_since("node lost") <= TIMEOUT_S + SLACK_S, tail
    survivors = [line for line in job.output.splitlines() if line.startswith("[node2]") and "lost contact" in line]
    assert survivors, tail
    for rank in range(RANKS_PER_NODE, 2 * RANKS_PER_NODE):
        line = next((line for line in survivors if f"rank {rank} lost contact" in line), "")
        assert "the heartbeat store on rank 0's host node1 does not answer" in line, tail
