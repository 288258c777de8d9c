"""The heartbeat store: a tiny key-value server that keeps every rank's latest heartbeat.

Run as its own process, `python harness/process/heartbeat_store.py`, by rank 0 of a job
(harness.process.heartbeat says why a process of its own, and why on rank 0's host). It prints one
line, "TCP_PORT UDP_PORT", the ports the system gave it, and then serves until its standard input
closes, which happens when the rank that started it ends in any way (SIGKILL included), so it never
outlives the job:

- UDP, PORT: each datagram is one rank's heartbeat, "RANK<TAB>STEP<TAB>HOST<TAB>PID<TAB>PHASE"; the store
  keeps the latest per rank with the time it arrived on the store's own clock (the ranks' clocks
  may disagree across nodes; ages are measured on one clock only). A lost datagram is a missed
  beat, nothing more, and a sender never waits for the store.
- TCP, PORT: a connection gets one JSON object, {RANK: {"step", "host", "pid", "phase", "age"}} with
  `age` the seconds since that rank's latest heartbeat arrived, and is closed.

Plain Python and the standard library only: it starts in a fraction of a second where importing
torch takes seconds, and holds a few megabytes.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import threading
import time
from typing import BinaryIO, TextIO

DATAGRAM_BYTES = 2048  # a heartbeat is about a hundred bytes


def encode_beat(rank: int, step: int, host: str, pid: int, phase: str) -> bytes:
    """One heartbeat datagram."""
    return f"{rank}\t{step}\t{host}\t{pid}\t{phase}".encode()


def decode_beat(datagram: bytes) -> tuple[int, dict]:
    """(rank, its fields) of a heartbeat datagram; ValueError if it is not one."""
    rank, step, host, pid, phase = datagram.decode(errors="replace").split("\t", 4)
    return int(rank), {"step": int(step), "host": host, "pid": int(pid), "phase": phase}


def bind(kind: int) -> socket.socket:
    """A socket of `kind` (SOCK_STREAM or SOCK_DGRAM) on a free port of every address of this host,
    IPv6 and IPv4 alike where the host has both (peers may reach it by either)."""
    if socket.has_dualstack_ipv6():
        try:
            sock = socket.socket(socket.AF_INET6, kind)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            return sock
        except OSError:
            sock.close()
    sock = socket.socket(socket.AF_INET, kind)
    sock.bind(("0.0.0.0", 0))
    return sock


class Beats:
    """The latest heartbeat of each rank and when it arrived (monotonic seconds)."""

    def __init__(self) -> None:
        self._latest: dict[int, tuple[dict, float]] = {}
        self._lock = threading.Lock()

    def put(self, rank: int, fields: dict) -> None:
        with self._lock:
            self._latest[rank] = (fields, time.monotonic())

    def snapshot(self) -> dict[str, dict]:
        """Every rank's latest heartbeat with its age in seconds, by rank (as a JSON key)."""
        now = time.monotonic()
        with self._lock:
            return {str(rank): {**fields, "age": now - arrived} for rank, (fields, arrived) in self._latest.items()}


def _receive(udp: socket.socket, beats: Beats) -> None:
    while True:
        try:
            datagram = udp.recv(DATAGRAM_BYTES)
        except OSError:
            return  # closed: the store ends
        try:
            beats.put(*decode_beat(datagram))
        except ValueError:
            continue  # not a heartbeat: ignored


def _answer(tcp: socket.socket, beats: Beats) -> None:
    while True:
        try:
            connection, _ = tcp.accept()
        except OSError:
            return  # closed: the store ends
        with connection:
            connection.settimeout(5.0)
            try:
                connection.sendall(json.dumps(beats.snapshot()).encode())
            except OSError:
                continue  # the reader gave up; the next one gets its answer


def serve(stdin: BinaryIO, stdout: TextIO) -> None:
    """Serve heartbeats until `stdin` closes."""
    beats = Beats()
    udp, tcp = bind(socket.SOCK_DGRAM), bind(socket.SOCK_STREAM)
    tcp.listen(128)
    for target, sock in ((_receive, udp), (_answer, tcp)):
        threading.Thread(target=target, args=(sock, beats), daemon=True).start()
    print(f"{tcp.getsockname()[1]} {udp.getsockname()[1]}", file=stdout, flush=True)
    try:
        while stdin.read(4096):
            pass
    finally:
        for sock in (udp, tcp):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread waiting on it
            sock.close()


if __name__ == "__main__":
    # Ctrl-C, and a batch system's preemption signals (Slurm's --signal, PBS's SIGTERM), reach every
    # process of the job: the store ends with its rank instead, so that a preempted job that hangs
    # while it writes its checkpoint still names the rank that stopped.
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)
    serve(sys.stdin.buffer, sys.stdout)
