"""Heartbeats: each rank publishes its step and phase, so that a hang names the rank that stopped.

When a collective times out (--timeout), the survivors know only that some peer did not answer;
which one, and where it was, is what a user needs to look at the right node (frameworks' most
frequent complaint: pytorch#97191, NVIDIA/nccl#1111). So every rank publishes its latest (step,
phase) as a heartbeat, and a survivor whose collective timed out reads every rank's latest one and
names in its error line the ranks that stopped: their host, step, phase and how long ago they were
last seen (`who_stopped`).

Design, and why:
- One store per job, a process of its own (harness.process.heartbeat_store) that rank 0 starts
  on its host before the backend starts its communication. Its own process because a store inside
  a rank stops with that rank: a SIGSTOPped or hung rank 0 could not serve it, and rank 0 is as
  likely as any to be the one that stopped. Rank 0's host because every launcher (torchrun, mpirun,
  srun, horovodrun, deepspeed) already tells every rank how to reach it (ClusterEnv.master_addr).
  Not a framework's store: torchrun's and DeepSpeed's TCPStore, Horovod's HTTP rendezvous and MPI
  differ per launcher and some backends have none; the harness's own works for every backend in
  the registry and every launcher, on one node and across nodes.
- Ports: the store binds ports the system picks (no derived port can collide with another job on
  the node, such as two horovodrun jobs that both default to MASTER_PORT 29500), and rank 0 hands
  them to every rank with one sum over ranks when the run starts, the only collective here.
- Cheap: the loop's `beat` stores a tuple; a UDP datagram (never waits, never blocks a step) goes
  out at the start of each step and on a phase change at most every MIN_GAP_S, and a background
  thread re-sends the latest every INTERVAL_S and whatever the loop changed since (POLL_S). The
  store stamps arrivals on its own clock, so ages do not depend on the nodes' clocks agreeing.
  So a rank hung in a collective (alive, its thread beating) shows its exact phase; a frozen or
  cut-off one shows its step exactly and a phase it was in at most POLL_S before it froze.
- Reading happens only after a collective failed: one TCP request, at most READ_TIMEOUT_S. The
  ports are ephemeral ones, as gloo's and NCCL's own connections between the nodes are.
- If rank 0's host is cut off, its store cannot answer: that silence is itself the evidence, and
  the survivors name rank 0's host as the one that stopped answering.

A rank whose latest heartbeat is older than `stale_after(--timeout)` stopped (SIGSTOP, a lost node,
a dead process). A survivor ends such a rank with SIGKILL when it runs on the survivor's own host
(`end_frozen_here`): a frozen process cannot act on the SIGTERM that torchrun and the DeepSpeed
launcher send it when the survivor exits, and both launchers then wait 30 s before their own
SIGKILL, so the job would outlast --timeout + 30 s. When none stopped, a rank stuck inside a
collective or on its device still beats, and the line names the rank furthest behind instead. `--no-heartbeat` turns all of this off.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .discovery import ClusterEnv
from .heartbeat_store import encode_beat
from .phases import PHASES, START
from .processes import command_line

INTERVAL_S = 1.0  # a live rank's heartbeat is re-sent at least this often
POLL_S = 0.05  # how often the sender thread looks for a phase the loop changed
MIN_GAP_S = 0.01  # the loop sends a phase change itself only this long after the last send
READ_TIMEOUT_S = 5.0  # how long a survivor waits for the store's answer
START_TIMEOUT_S = 20.0  # how long rank 0 waits for its store to say its ports
MAX_NAMED = 8  # ranks listed by name in the line; the rest are counted
# Run as a script, not `-m harness...`: it needs the standard library only, so it starts however this
# process found the harness (a notebook's sys.path), and without importing the package.
STORE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "heartbeat_store.py")
log = logging.getLogger("harness")

# The phases the training loop reports (harness.process.phases), by label, in the order of a step.
LABELS = list(dict.fromkeys(phase.label for phase in PHASES))
# A phase's suffix while the rank waits for a collective inside it: "optimizer, waiting in all_gather".
WAITING_IN = ", waiting in "


@dataclass(frozen=True)
class Seen:
    """One rank's latest heartbeat as the store had it: where it was, and how long ago."""

    rank: int
    host: str
    step: int
    phase: str
    age: float  # seconds since it arrived
    pid: int = 0  # its process on `host`

    def describe(self) -> str:
        return f"rank {self.rank} (host {self.host}, step {self.step}, {self.phase}, last seen {self.age:.1f} s ago)"


def _within(phase: str) -> str:
    """The phase a heartbeat's phase is in, without the collective waited for inside it."""
    return phase.split(WAITING_IN)[0]


def _phase_order(phase: str) -> int:
    """Where `phase` falls in a step (a collective waited for inside it: where its phase falls)."""
    return LABELS.index(_within(phase)) if _within(phase) in LABELS else 0


def stale_after(timeout: float) -> float:
    """Seconds without a heartbeat after which a rank counts as stopped: half of --timeout, between
    3 heartbeat intervals (a loaded node may delay one) and 10 s."""
    return max(3 * INTERVAL_S, min(timeout / 2, 10.0))


def stopped(seen: dict[int, Seen], world_size: int, threshold: float) -> tuple[list[Seen], list[int]]:
    """(the ranks whose latest heartbeat is older than `threshold`, oldest first; the ranks never seen)."""
    stale = sorted((entry for entry in seen.values() if entry.age > threshold), key=lambda entry: -entry.age)
    return stale, [rank for rank in range(world_size) if rank not in seen]


def describe(seen: Optional[dict[int, Seen]], world_size: int, timeout: float, store_host: str, reader: int) -> str:
    """The clause of the survivors' line that names who stopped, from the store's answer (None: no
    answer) as rank `reader`, a survivor, read it."""
    if seen is None:
        return (
            f"the heartbeat store on rank 0's host {store_host} does not answer, so that host stopped "
            "answering (rank 0 and the ranks beside it: cut off, or the node is down)"
        )
    threshold = stale_after(timeout)
    if reader not in seen or seen[reader].age > threshold:  # even a live rank's beats do not arrive
        return (
            f"another rank died or stopped answering (the heartbeats of rank {reader} do not reach the store "
            f"on {store_host}: is UDP blocked between the nodes?)"
        )
    stale, missing = stopped(seen, world_size, threshold)
    named = [entry.describe() for entry in stale] + [f"rank {rank} (never seen)" for rank in missing]
    if named:
        listed = ", ".join(named[:MAX_NAMED])
        more = f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
        alive = [entry.age for entry in seen.values() if entry.age <= threshold]
        others = f"; the other ranks were seen within {max(alive):.1f} s" if alive else ""
        return f"stopped answering: {listed}{more}{others}"
    behind = min(seen.values(), key=lambda entry: (entry.step, _phase_order(entry.phase)))
    return (
        f"every rank was seen within {threshold:.0f} s (as are one that just died and one stuck inside a "
        f"collective or on its device); furthest behind: {behind.describe()}"
    )


def end_frozen_here(stale: list[Seen], host: str) -> list[int]:
    """SIGKILL the stopped ranks whose process runs on `host` (this one), if it is still a harness
    process; return their ranks. Only when this rank's own beats arrive (the caller checks), so a
    store that hears nobody never has every rank ended."""
    ended = []
    for entry in stale:
        if entry.host != host or entry.pid in (0, os.getpid()):
            continue
        if "harness" not in (command_line(entry.pid) or ""):
            continue  # the rank ended (and its pid may have gone to another process)
        try:
            os.kill(entry.pid, signal.SIGKILL)
        except OSError:  # ProcessLookupError included: it ended meanwhile, or is not ours to end
            continue
        log.warning(f"harness: ended rank {entry.rank} (pid {entry.pid} on this host), which stopped answering")
        ended.append(entry.rank)
    return ended


def parse_snapshot(text: str) -> dict[int, Seen]:
    """The store's answer (harness.process.heartbeat_store) as Seen by rank."""
    return {
        int(rank): Seen(
            int(rank), fields["host"], int(fields["step"]), fields["phase"], float(fields["age"]), int(fields["pid"])
        )
        for rank, fields in json.loads(text).items()
    }


def read_store(host: str, port: int, timeout: float = READ_TIMEOUT_S) -> Optional[dict[int, Seen]]:
    """Every rank's latest heartbeat from the store at host:port (TCP); None if it does not answer
    within `timeout`."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            chunks = []
            while chunk := connection.recv(65536):
                chunks.append(chunk)
        return parse_snapshot(b"".join(chunks).decode())
    except (OSError, ValueError, KeyError):
        return None


class Heartbeat:
    """This rank's heartbeat: `beat` from the loop, a sender thread, and the read after a failure."""

    def __init__(self, cluster: Optional[ClusterEnv] = None, store: Optional[subprocess.Popen] = None) -> None:
        self.cluster = cluster
        self._store = store  # rank 0's store process
        self._latest: tuple[int, str] = (0, START.label)
        self._sent: Optional[tuple[int, str]] = None
        self._sent_at = 0.0
        self._address: Optional[tuple[Any, ...]] = None  # the store's UDP address
        self._tcp: Optional[tuple[str, int]] = None
        self._host = socket.gethostname()  # sent with every beat: where the rank runs
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @classmethod
    def start(cls, cluster: ClusterEnv, enabled: bool) -> Heartbeat:
        """This rank's heartbeat (call before the backend starts its communication: rank 0 starts
        the store here); off when not `enabled` or with one rank, which has no peer to wait for."""
        if not enabled or cluster.world_size == 1:
            return cls()
        store = None
        if cluster.is_main:
            try:
                store = subprocess.Popen([sys.executable, STORE_SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            except OSError as exc:  # then rank 0 hands out no ports, and every rank stays off
                log.warning(f"harness: the heartbeat store did not start ({exc}); a hang will not name who stopped")
        return cls(cluster, store)

    @property
    def running(self) -> bool:
        """True once connected: heartbeats go out and a failure names who stopped."""
        return self._sock is not None

    def connect(self, all_reduce_sum: Callable[[Any], Any], device: Any) -> None:
        """Learn the store's ports from rank 0 (one sum over ranks: call it on every rank, after the
        backend's init) and start sending. If rank 0's store did not start, every rank stays off."""
        if self.cluster is None:
            return
        import torch

        ports = self._store_ports() if self._store is not None else (0, 0)
        shared = all_reduce_sum(torch.tensor(ports, dtype=torch.float32, device=device)).tolist()
        tcp_port, udp_port = (int(port) for port in shared)
        if not tcp_port:
            return
        host = self.cluster.master_addr
        try:
            family, kind, proto, _, address = socket.getaddrinfo(host, udp_port, type=socket.SOCK_DGRAM)[0]
        except OSError as exc:
            log.warning(f"harness: rank {self.cluster.rank} cannot resolve {host} ({exc}); it sends no heartbeat")
            return
        self._sock = socket.socket(family, kind, proto)
        self._sock.setblocking(False)  # a full send buffer drops a beat instead of waiting
        self._address, self._tcp = address, (host, tcp_port)
        self._thread = threading.Thread(target=self._keep_beating, name="harness-heartbeat", daemon=True)
        self._thread.start()

    def _store_ports(self) -> tuple[int, int]:
        """The ports rank 0's store printed, or (0, 0) if it did not within START_TIMEOUT_S."""
        assert self._store is not None and self._store.stdout is not None
        ready, _, _ = select.select([self._store.stdout], [], [], START_TIMEOUT_S)
        words = self._store.stdout.readline().split() if ready else []
        if len(words) != 2:
            log.warning("harness: the heartbeat store did not start; a hang will not name the rank that stopped")
            return 0, 0
        return int(words[0]), int(words[1])

    def beat(self, step: int, phase: str) -> None:
        """This rank is now at optimizer step `step` (1-based), in `phase`. Costs a tuple on most
        calls; a datagram when the step changes or MIN_GAP_S passed since the last one."""
        self._latest = (step, phase)
        if self._sock is not None and (step != self._sent_step() or time.monotonic() - self._sent_at >= MIN_GAP_S):
            self._send()

    def in_collective(self, kind: Optional[str]) -> None:
        """This rank now waits for a collective of `kind` inside its phase (None: no longer)."""
        step, phase = self._latest
        self.beat(step, _within(phase) if kind is None else f"{_within(phase)}{WAITING_IN}{kind}")

    def _sent_step(self) -> int:
        return self._sent[0] if self._sent is not None else -1

    def _send(self) -> None:
        latest = self._latest
        assert self._sock is not None and self.cluster is not None
        try:
            self._sock.sendto(
                encode_beat(self.cluster.rank, latest[0], self._host, os.getpid(), latest[1]), self._address
            )
        except OSError:
            pass  # a full buffer or an unreachable store: the next beat tries again
        self._sent, self._sent_at = latest, time.monotonic()

    def _keep_beating(self) -> None:
        while not self._stop.wait(POLL_S):
            if self._latest != self._sent or time.monotonic() - self._sent_at >= INTERVAL_S:
                self._send()

    def who_stopped(self, timeout: float) -> Optional[str]:
        """The clause naming the ranks that stopped (see `describe`); None when the heartbeat is off."""
        if not self.running or self.cluster is None:
            return None
        assert self._tcp is not None
        cluster = self.cluster
        seen, threshold = read_store(*self._tcp), stale_after(timeout)
        if seen is not None and cluster.rank in seen and seen[cluster.rank].age <= threshold:
            end_frozen_here(stopped(seen, cluster.world_size, threshold)[0], self._host)
        return describe(seen, cluster.world_size, timeout, cluster.master_addr, cluster.rank)

    def stop(self) -> None:
        """Stop sending, and on rank 0 end the store."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL_S + 1)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._store is not None:
            assert self._store.stdin is not None and self._store.stdout is not None
            self._store.stdin.close()  # the store ends when its input closes
            try:
                self._store.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._store.kill()
                self._store.wait()
            self._store.stdout.close()
            self._store = None
