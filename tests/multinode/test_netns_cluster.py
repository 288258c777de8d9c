"""The namespace cluster itself (netns_cluster.py): names, addresses, isolation, its ssh, failures,
shaping, and teardown from its records, including after its owner was killed. Seconds in all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from harness.process.processes import name, running
from tests.scheduler.test_job_templates import shellcheck

from .netns_cluster import (
    ENTER_NODE,
    RECORDS_DIR,
    RSH_AGENT,
    NetnsCluster,
    ShapingUnavailable,
    namespace_pids,
    remove_stale_clusters,
)

# Node 1 serves BYTES once on PORT; node 2 reads them and prints the seconds it took.
PORT = 5000
SEND = textwrap.dedent("""
    import socket, sys
    with socket.create_server(("", int(sys.argv[1]))) as server:
        print("listening", flush=True)
        connection, _ = server.accept()
        with connection:
            connection.sendall(b"x" * int(sys.argv[2]))
""")
RECEIVE = textwrap.dedent("""
    import socket, sys, time
    started = time.monotonic()
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as sock:
        received = 0
        while chunk := sock.recv(1 << 16):
            received += len(chunk)
    print(received, time.monotonic() - started)
""")


def _namespaces() -> set:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.split())


def _transfer_seconds(cluster: NetnsCluster, size: int) -> float:
    """Seconds node 2 takes to receive `size` bytes from node 1 over the bridge."""
    server = cluster.popen(1, [sys.executable, "-c", SEND, str(PORT), str(size)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        result = cluster.run(2, [sys.executable, "-c", RECEIVE, "node1", str(PORT)], timeout=60)
        assert result.returncode == 0, result.stderr
        received, seconds = result.stdout.split()
        assert int(received) == size
        return float(seconds)
    finally:
        server.kill()
        server.wait()


def test_each_node_has_its_own_name_and_address_and_resolves_the_others(cluster):
    for node, (host, address) in enumerate(zip(cluster.hostnames, cluster.addresses), start=1):
        other = cluster.hostnames[2 - node]
        result = cluster.run(
            node, ["sh", "-c", f"hostname; getent ahostsv4 {other} | head -n 1; ip -4 -o addr show dev eth0"]
        )
        assert result.returncode == 0, result.stderr
        name, resolved, interface = result.stdout.splitlines()
        assert name == host
        assert resolved.split() == [cluster.address(other), "STREAM", other]
        assert f"inet {address}/24" in interface
    assert subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip() != cluster.hostnames[0]


def test_the_nodes_reach_each_other_and_nothing_else(cluster):
    routes = cluster.run(1, ["ip", "-4", "route"]).stdout.strip().splitlines()
    assert len(routes) == 1 and routes[0].startswith("10.77.0.0/24 dev eth0"), routes  # no default route
    # The host's own namespace gains nothing: no interface, no address in the cluster's subnet.
    host = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    assert "10.77.0." not in host
    assert not any(
        line.split(":")[1].strip().startswith(("eth0@", "n1", "br0"))
        for line in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    )


def test_the_clusters_ssh_runs_a_command_line_on_the_named_node_in_a_fresh_environment(cluster):
    env = cluster.environ({"LEAKED_FROM_THE_CALLER": "1"})
    # As OpenMPI and horovodrun call ssh: options before and after the host, the command in words.
    result = subprocess.run(
        [
            RSH_AGENT,
            "-o",
            "StrictHostKeyChecking=no",
            "node2",
            "-o",
            "ConnectTimeout=5",
            "echo",
            "$(hostname)",
            "${LEAKED_FROM_THE_CALLER:-unset}",
            ";",
            "echo",
            "second",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["node2", "unset", "second"]
    unknown = subprocess.run([RSH_AGENT, "node9", "true"], capture_output=True, text=True, env=env, timeout=20)
    assert unknown.returncode == 255 and "no node 'node9'" in unknown.stderr


def test_a_node_whose_link_is_down_is_unreachable_until_it_is_up_again(cluster):
    probe = [sys.executable, "-c", "import socket; socket.create_connection(('node2', 9), timeout=2)"]
    refused = cluster.run(1, probe)
    assert "ConnectionRefusedError" in refused.stderr  # node 2 answers: nothing listens on port 9
    cluster.set_link(2, up=False)
    assert "timed out" in cluster.run(1, probe).stderr  # silence: no answer at all
    cluster.set_link(2, up=True)
    assert "ConnectionRefusedError" in cluster.run(1, probe).stderr


def test_shaping_limits_the_rate_and_says_when_the_kernel_cannot_delay(cluster):
    size = 1_000_000
    unshaped = _transfer_seconds(cluster, size)
    cluster.shape(rate_mbit=8, node=2)  # 1 MB at 8 Mbit/s: about 1 s
    shaped = _transfer_seconds(cluster, size)
    assert shaped >= 0.7 and shaped > 3 * unshaped, (unshaped, shaped)
    try:
        cluster.shape(latency_ms=50, node=2)
    except ShapingUnavailable as exc:  # this kernel lacks netem (CONFIG_NET_SCH_NETEM)
        assert "netem" in str(exc)
    else:
        assert _transfer_seconds(cluster, 1) >= 0.05  # a connection takes at least one delayed round trip
    cluster.shape(node=2)
    assert _transfer_seconds(cluster, size) < max(0.5, 3 * unshaped)


def test_stop_ends_what_runs_on_the_nodes_and_removes_every_namespace(tmp_path):
    before = _namespaces()
    cluster = NetnsCluster(2, str(tmp_path / "cluster")).start()
    try:
        sleeper = cluster.popen(2, ["sleep", "600"])
        assert set(cluster.namespaces) | {cluster.switch} <= _namespaces()
        deadline = time.monotonic() + 10
        while name(sleeper.pid) != "sleep" and time.monotonic() < deadline:
            time.sleep(0.05)  # until enter_node.sh has set the node up (its stages exec: one process)
        assert namespace_pids(cluster.namespaces[1]) == [sleeper.pid]
    finally:
        cluster.stop()
    assert sleeper.wait(timeout=10) == -signal.SIGKILL
    assert _namespaces() == before
    assert not os.path.exists(cluster.record_path)
    cluster.stop()  # twice is harmless


OWNER = textwrap.dedent("""
    import os, signal, subprocess, sys
    sys.path.insert(0, sys.argv[2])
    from tests.multinode.netns_cluster import NetnsCluster
    cluster = NetnsCluster(2, sys.argv[1]).start()
    sleeper = cluster.popen(2, ["sleep", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(cluster.tag, sleeper.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no finalizer, no atexit: a test run killed mid-test
""")


def test_a_cluster_whose_owner_was_killed_is_removed_by_the_next_start(tmp_path):
    before = _namespaces()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    owner = subprocess.run(
        [sys.executable, "-c", OWNER, str(tmp_path / "stale"), repo], capture_output=True, text=True, timeout=60
    )
    assert owner.returncode == -signal.SIGKILL, owner.stderr
    tag, sleeper = owner.stdout.split()
    assert os.path.exists(os.path.join(RECORDS_DIR, f"{tag}.json"))
    assert len(_namespaces() - before) == 3  # two nodes and the switch, left behind
    with NetnsCluster(2, str(tmp_path / "fresh")):
        assert not os.path.exists(os.path.join(RECORDS_DIR, f"{tag}.json"))
        assert not running(int(sleeper))  # gone, or a zombie its parent has yet to reap
        assert not any(tag in name for name in _namespaces())
    assert _namespaces() == before
    assert remove_stale_clusters() == []


def test_a_cluster_of_three_nodes(tmp_path):
    with NetnsCluster(3, str(tmp_path / "cluster")) as cluster:
        result = cluster.run(3, ["getent", "hosts", "node1", "node2", "node3"])
        assert [line.split()[1] for line in result.stdout.splitlines()] == ["node1", "node2", "node3"]
        assert cluster.run(3, ["hostname"]).stdout.strip() == "node3"


def test_the_clusters_scripts_pass_shellcheck():
    shellcheck([ENTER_NODE, RSH_AGENT])
