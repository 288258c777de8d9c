"""A cluster of N nodes on one machine, for tests that must cross a network: Linux network namespaces.

Node k (1..N) is a network namespace with loopback up and one veth interface, eth0, with address
10.77.0.k/24, whose other end is a port of a bridge in a further namespace of the cluster's own
(the switch). Nothing is added to the machine's own namespace: no interface, no route, no hosts
entry, so the nodes reach each other and nothing else, and nothing outside reaches them. A command
runs on node k through enter_node.sh: the node's network namespace (nsenter), the node's own hostname
(nodeK, a UTS namespace) and the cluster's hosts file bind-mounted over /etc/hosts (a mount
namespace), so every node resolves every other by name. rsh_agent.sh is the cluster's ssh, for
`mpirun --mca plm_rsh_agent` and (as `ssh` on PATH) for horovodrun.

Teardown works from records, not from memory: before anything is created, the names it will get
are written to RECORDS_DIR/<tag>.json together with the owner's pid and start time. `stop()` kills
every process still inside the nodes (deleting a namespace's name ends none of them) and deletes
the namespaces, then the record. A test process killed before it
could do that leaves its record, and the next cluster to start removes every cluster whose owner
is gone (`remove_stale_clusters`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Optional

from harness.process.processes import end_processes
from tests.helpers.owner_records import stale_records, write_record

HERE = os.path.dirname(os.path.abspath(__file__))
ENTER_NODE = os.path.join(HERE, "enter_node.sh")
RSH_AGENT = os.path.join(HERE, "rsh_agent.sh")
# /run is a tmpfs, like /run/netns where `ip` keeps the namespaces: both are gone after a reboot.
RECORDS_DIR = "/run/dp-harness-netns"
NAME_PREFIX = "dph"
SUBNET = "10.77.0"  # private; only the cluster's own namespaces hold addresses in it
COMMAND_TIMEOUT_S = 20.0


class NamespacesUnavailable(RuntimeError):
    """This machine does not let this process create network namespaces (not root, or no kernel support)."""


class ShapingUnavailable(RuntimeError):
    """The kernel lacks the queueing discipline a shaping request needs (netem for latency)."""


def _ip(*args: str, namespace: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {result.returncode}): {result.stderr.strip()}")
    return result


def namespace_pids(namespace: str) -> list[int]:
    """Processes whose network namespace is `namespace` (empty if it does not exist)."""
    result = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    return [int(word) for word in result.stdout.split() if word.isdigit()]


def kill_namespace_processes(namespace: str, timeout: float = 10.0) -> None:
    """SIGKILL every process inside `namespace` and wait (bounded) until none is left."""
    end_processes(lambda: namespace_pids(namespace), grace=0, timeout=timeout)


def _teardown(record: dict) -> None:
    """Remove what a record lists: the processes in its namespaces, then the namespaces."""
    existing = set(
        subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
        ).stdout.split()
    )
    for namespace in record["namespaces"]:
        if namespace in existing:
            kill_namespace_processes(namespace)
            # Deleting a namespace deletes its interfaces, and a veth with one end gone loses the other.
            _ip("netns", "delete", namespace, check=False)


def remove_stale_clusters() -> list[str]:
    """Tear down every recorded cluster whose owning process is gone; return their tags."""
    removed = []
    for path, record in stale_records(RECORDS_DIR):
        _teardown(record)
        os.unlink(path)
        removed.append(record["tag"])
    return removed


def check_namespaces() -> None:
    """Raise NamespacesUnavailable (one line) unless a network namespace with a veth and a bridge,
    a UTS namespace and a mount namespace can be made here; leaves nothing behind."""
    missing = [tool for tool in ("ip", "nsenter", "unshare", "hostname", "mount") if not shutil.which(tool)]
    if missing:
        raise NamespacesUnavailable(f"{', '.join(missing)} not installed (iproute2, util-linux)")
    if os.geteuid() != 0:
        raise NamespacesUnavailable("network namespaces need root; run the multi-node tests as root")
    probe = f"{NAME_PREFIX}probe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", "p0", "type", "veth", "peer", "name", "p1", namespace=probe)
        _ip("link", "add", "b0", "type", "bridge", namespace=probe)
        # As enter_node.sh enters a node.
        subprocess.run(
            [
                "nsenter",
                f"--net=/run/netns/{probe}",
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "hostname",
                "probe",
            ],
            check=True,
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
        raise NamespacesUnavailable(f"this machine does not allow network namespaces here ({exc})") from None
    finally:
        _ip("netns", "delete", probe, check=False)


class NetnsCluster:
    """N nodes (network + UTS + mount namespaces) on a private bridge; see the module docstring."""

    def __init__(self, nodes: int, directory: str, domains: Sequence[str] = ()) -> None:
        """`domains`: networks the nodes are also known on, as nodeK.DOMAIN (a site's high-speed
        network, e.g. Polaris' hsn.cm.polaris.alcf.anl.gov, where `harness study` meets rank 0)."""
        if not 1 <= nodes <= 200:
            raise ValueError(f"a namespace cluster has 1 to 200 nodes, not {nodes}")
        self.tag = uuid.uuid4().hex[:6]
        self.directory = os.path.abspath(directory)
        self.hostnames = [f"node{k}" for k in range(1, nodes + 1)]
        self.domains = list(domains)
        self.addresses = [f"{SUBNET}.{k}" for k in range(1, nodes + 1)]
        self.switch = f"{NAME_PREFIX}{self.tag}sw"
        self.namespaces = [f"{NAME_PREFIX}{self.tag}n{k}" for k in range(1, nodes + 1)]
        self.record_path = os.path.join(RECORDS_DIR, f"{self.tag}.json")

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> NetnsCluster:
        """Create the switch and the nodes, after removing stale clusters; on failure undo it all."""
        check_namespaces()
        remove_stale_clusters()
        self._write_files()
        self._write_record()
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", namespace=self.switch)
            for name in ("lo", "br0"):
                _ip("link", "set", name, "up", namespace=self.switch)
            for index, namespace in enumerate(self.namespaces):
                self._add_node(index, namespace)
            self._wait_until_connected()
        except BaseException:
            self.stop()
            raise
        return self

    def _add_node(self, index: int, namespace: str) -> None:
        port = self.port(index + 1)
        _ip("netns", "add", namespace)
        # Both ends are created inside their namespaces: no interface ever appears on the host.
        _ip("link", "add", "eth0", "netns", namespace, "type", "veth", "peer", "name", port, "netns", self.switch)
        _ip("link", "set", port, "master", "br0", "up", namespace=self.switch)
        _ip("addr", "add", f"{self.addresses[index]}/24", "dev", "eth0", namespace=namespace)
        for name in ("lo", "eth0"):
            _ip("link", "set", name, "up", namespace=namespace)

    def _write_files(self) -> None:
        os.makedirs(os.path.join(self.directory, "nodes"), exist_ok=True)
        os.makedirs(os.path.join(self.directory, "bin"), exist_ok=True)
        with open(os.path.join(self.directory, "hosts"), "w") as handle:
            handle.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n::ffff:127.0.0.1 localhost\n")
            names = [" ".join([host, *(f"{host}.{domain}" for domain in self.domains)]) for host in self.hostnames]
            handle.writelines(f"{address} {name}\n" for address, name in zip(self.addresses, names))
            # A dual-stack server (torch's store) sees IPv4 peers as ::ffff:a.b.c.d and looks those up
            # by name; the nodes have no DNS server, so without these every lookup fails (with a warning).
            handle.writelines(f"::ffff:{address} {name}\n" for address, name in zip(self.addresses, names))
        for host, namespace in zip(self.hostnames, self.namespaces):
            with open(os.path.join(self.directory, "nodes", host), "w") as handle:
                handle.write(namespace + "\n")
        ssh = os.path.join(self.directory, "bin", "ssh")
        if not os.path.lexists(ssh):
            os.symlink(RSH_AGENT, ssh)  # horovodrun and pdsh-less launchers call plain `ssh`

    def _write_record(self) -> None:
        write_record(self.record_path, {"tag": self.tag, "namespaces": [*self.namespaces, self.switch]})

    def _wait_until_connected(self, timeout: float = 20.0) -> None:
        """Until node 1 reaches every node by name (the bridge forwards once its ports are up)."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.run(1, [sys.executable, "-c", _CONNECT_PROBE, *self.hostnames], timeout=timeout)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the namespace nodes cannot reach each other: {result.stderr.strip()[-2000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Kill every process on the nodes, delete the namespaces and the record; safe to call twice."""
        if os.path.exists(self.record_path):
            with open(self.record_path) as handle:
                record = json.load(handle)
            _teardown(record)
            os.unlink(self.record_path)

    def __enter__(self) -> NetnsCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- running commands on nodes ------------------------------------------------------------
    def environ(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        """This process's environment for node commands: NETNS_CLUSTER_DIR for the cluster's ssh, and
        its `ssh` first on PATH (horovodrun and the deepspeed launcher run plain `ssh`)."""
        env = dict(os.environ)
        env.update(extra or {})
        env["NETNS_CLUSTER_DIR"] = self.directory
        bin_dir = os.path.join(self.directory, "bin")
        if env.get("PATH", "").split(os.pathsep)[0] != bin_dir:
            env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        return env

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """`argv` as a command that runs on node `node` (1-based)."""
        return [ENTER_NODE, self.directory, self.hostnames[node - 1], *argv]

    def run(
        self,
        node: int,
        argv: Sequence[str],
        timeout: float = COMMAND_TIMEOUT_S,
        env: Optional[dict[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> subprocess.CompletedProcess:
        """Run `argv` on node `node` to completion (TimeoutExpired after `timeout`), capturing text output."""
        return subprocess.run(
            self.command(node, argv), capture_output=True, text=True, timeout=timeout, env=self.environ(env), cwd=cwd
        )

    def popen(
        self, node: int, argv: Sequence[str], env: Optional[dict[str, str]] = None, **kwargs
    ) -> subprocess.Popen:
        """Start `argv` on node `node`; the Popen's pid is the command's own (enter_node.sh execs)."""
        return subprocess.Popen(self.command(node, argv), env=self.environ(env), **kwargs)

    # -- failures and shaping -------------------------------------------------------------------
    def address(self, name: str) -> str:
        """The address `name` (a node's hostname, or an address) stands for on the cluster's network."""
        return dict(zip(self.hostnames, self.addresses)).get(name, name)

    def port(self, node: int) -> str:
        """The switch's interface facing node `node`."""
        return f"n{node}"

    def set_link(self, node: int, up: bool) -> None:
        """Plug node `node`'s cable in or out: its processes keep running but reach nobody, and
        nobody hears from them (no FIN, no RST), as when a node's network or power fails."""
        _ip("link", "set", self.port(node), "up" if up else "down", namespace=self.switch)

    def kill_node(self, node: int) -> None:
        """SIGKILL every process on node `node` (a crashed node; pull its link first to silence it)."""
        kill_namespace_processes(self.namespaces[node - 1])

    def pids(self, node: int) -> list[int]:
        """Processes running on node `node`."""
        return namespace_pids(self.namespaces[node - 1])

    def shape(self, latency_ms: float = 0.0, rate_mbit: float = 0.0, node: Optional[int] = None) -> None:
        """Shape the traffic towards node `node` (every node if None): `latency_ms` of added one-way
        delay (netem) and at most `rate_mbit` (a token bucket); 0 for neither removes the shaping.
        Raises ShapingUnavailable if the kernel lacks netem and a latency was asked for."""
        for index in [node] if node else range(1, len(self.namespaces) + 1):
            port = self.port(index)
            _ip("-n", self.switch, "link", "show", port)  # fail early for an unknown node
            subprocess.run(
                ["ip", "netns", "exec", self.switch, "tc", "qdisc", "del", "dev", port, "root"],
                capture_output=True,
                timeout=COMMAND_TIMEOUT_S,
            )
            if latency_ms > 0:
                self._tc(port, ["root", "handle", "1:", "netem", "delay", f"{latency_ms}ms"], "netem")
            if rate_mbit > 0:
                parent = ["parent", "1:1", "handle", "10:"] if latency_ms > 0 else ["root"]
                # burst: at least one rate-millisecond of bytes, never below a jumbo frame's
                burst = max(16 * 1024, int(rate_mbit * 1e6 / 8 / 1000))
                self._tc(
                    port, [*parent, "tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "100ms"], "tbf"
                )

    def _tc(self, port: str, spec: list[str], kind: str) -> None:
        result = subprocess.run(
            ["ip", "netns", "exec", self.switch, "tc", "qdisc", "add", "dev", port, *spec],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
        if result.returncode != 0 and "unknown" in result.stderr.lower():
            raise ShapingUnavailable(
                f"this kernel has no '{kind}' queueing discipline (CONFIG_NET_SCH_"
                f"{kind.upper()}): {result.stderr.strip()}"
            )
        if result.returncode != 0:
            raise RuntimeError(f"tc qdisc add {' '.join(spec)} failed: {result.stderr.strip()}")


# Run on node 1: every node's name resolves and its address answers (ECONNREFUSED from the discard
# port, where nothing listens, is an answer: the node is there).
_CONNECT_PROBE = """
import errno, socket, sys
for host in sys.argv[1:]:
    with socket.socket() as sock:
        sock.settimeout(2)
        code = sock.connect_ex((socket.gethostbyname(host), 9))
        if code not in (0, errno.ECONNREFUSED):
            sys.exit(f"{host}: {errno.errorcode.get(code, code)}")
"""
