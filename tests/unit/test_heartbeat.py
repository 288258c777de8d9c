"""The heartbeat's bookkeeping, in-process: who counts as stopped, the survivors' line, and the
store's protocol (served from a thread here; tests/integration/test_stuck_rank.py runs it for real)."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from harness.process import heartbeat, phases
from harness.process.heartbeat import Seen, describe, read_store, stale_after, stopped
from harness.process.heartbeat_store import decode_beat, encode_beat, serve
from harness.process.launchers import free_port


def _seen(rank: int, age: float, step: int = 41, phase: str = phases.FORWARD.label, host: str = "") -> Seen:
    return Seen(rank, host or f"node{rank // 2 + 1}", step, phase, age)


def test_stale_after_is_half_the_timeout_within_its_bounds():
    assert stale_after(10) == 5
    assert stale_after(600) == 10  # a long --timeout still names a rank silent for 10 s
    assert stale_after(1) == 3 * heartbeat.INTERVAL_S  # never within a loaded node's delay of a beat


def test_stopped_ranks_are_the_stale_ones_oldest_first_and_the_never_seen():
    seen = {0: _seen(0, 0.4), 1: _seen(1, 12.0), 3: _seen(3, 30.0)}
    stale, missing = stopped(seen, world_size=4, threshold=5.0)
    assert [entry.rank for entry in stale] == [3, 1]
    assert missing == [2]


def test_the_line_names_rank_host_step_phase_and_age():
    seen = {0: _seen(0, 0.4), 1: _seen(1, 12.04, step=5, phase=phases.GRADIENT_SYNC.label, host="gpu07")}
    line = describe(seen, world_size=2, timeout=10, store_host="gpu01", reader=0)
    assert line == (
        "stopped answering: rank 1 (host gpu07, step 5, gradient sync, last seen 12.0 s ago); "
        "the other ranks were seen within 0.4 s"
    )


def test_a_silenced_node_names_each_of_its_ranks():
    seen = {0: _seen(0, 0.2), 1: _seen(1, 0.9), 2: _seen(2, 21.0), 3: _seen(3, 20.5, phase=phases.DATA.label)}
    line = describe(seen, world_size=4, timeout=20, store_host="node1", reader=0)
    assert "rank 2 (host node2, step 41, forward/backward, last seen 21.0 s ago)" in line
    assert "rank 3 (host node2, step 41, data, last seen 20.5 s ago)" in line
    assert "rank 0 " not in line and "rank 1 " not in line


def test_many_stopped_ranks_are_counted_past_the_named_ones():
    seen = {0: _seen(0, 0.1), **{rank: _seen(rank, 30.0 + rank) for rank in range(1, 20)}}
    line = describe(seen, world_size=21, timeout=20, store_host="node1", reader=0)
    assert line.count("(host ") == heartbeat.MAX_NAMED
    assert line.startswith("stopped answering: rank 19 (")  # the longest silent first
    # Ranks 1-19 stale and rank 20 never seen: 20 stopped, MAX_NAMED of them by name.
    assert line.endswith(f"and {20 - heartbeat.MAX_NAMED} more; the other ranks were seen within 0.1 s")


def test_with_every_rank_beating_the_line_names_the_rank_furthest_behind():
    seen = {
        0: _seen(0, 0.3, step=7, phase=phases.GRADIENT_SYNC.label),
        1: _seen(1, 0.5, step=6, phase=phases.OPTIMIZER.label),
        2: _seen(2, 0.1, step=6, phase=phases.VOTE.label),
    }
    line = describe(seen, world_size=3, timeout=10, store_host="node1", reader=0)
    assert line.startswith("every rank was seen within 5 s (as are one that just died and one stuck inside")
    assert line.endswith("furthest behind: rank 1 (host node1, step 6, optimizer, last seen 0.5 s ago)")


def test_a_store_that_never_heard_from_the_reader_blames_nobody():
    """The reader is alive, so if its own beats are missing, none arrive (UDP blocked): naming every
    rank as never seen would be wrong."""
    seen = {0: _seen(0, 0.2)}
    line = describe(seen, world_size=4, timeout=10, store_host="node1", reader=2)
    assert line.startswith("another rank died or stopped answering (the heartbeats of rank 2 do not reach")
    assert "never seen" not in line


def test_a_store_that_does_not_answer_names_rank_0s_host():
    line = describe(None, world_size=8, timeout=10, store_host="nid001", reader=3)
    assert "rank 0's host nid001 does not answer" in line and "rank 0 and the ranks beside it" in line


def test_a_beat_survives_the_round_trip_through_its_datagram():
    assert decode_beat(encode_beat(3, 17, "node2", 4242, phases.EPOCH_END.label)) == (
        3,
        {"step": 17, "host": "node2", "pid": 4242, "phase": phases.EPOCH_END.label},
    )
    with pytest.raises(ValueError):
        decode_beat(b"not a heartbeat")


@pytest.fixture
def store():
    """The store served from a thread; its input is a pipe whose closing ends it. Yields its ports."""
    read_end, write_end = os.pipe()
    port_read, port_write = os.pipe()
    with open(read_end, "rb") as stdin, open(port_write, "w") as stdout:
        server = threading.Thread(target=serve, args=(stdin, stdout), daemon=True)
        server.start()
        with open(port_read) as ports:
            tcp, udp = (int(word) for word in ports.readline().split())
        yield tcp, udp
        os.close(write_end)
        server.join(timeout=10)
        assert not server.is_alive(), "the store did not end when its input closed"


def test_the_store_keeps_each_ranks_latest_beat_and_its_age(store):
    tcp, udp = store
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for beat in ((0, 4, phases.DATA.label), (1, 5, phases.OPTIMIZER.label), (0, 5, phases.VOTE.label)):
            sender.sendto(encode_beat(beat[0], beat[1], "here", 100 + beat[0], beat[2]), ("127.0.0.1", udp))
        deadline = time.monotonic() + 10
        while (seen := read_store("127.0.0.1", tcp)) is None or seen.get(0, _seen(0, 0, step=0)).step != 5:
            assert time.monotonic() < deadline, f"the store never had rank 0's second beat: {seen}"
            time.sleep(0.05)
    time.sleep(0.3)
    seen = read_store("127.0.0.1", tcp)
    assert (seen[0].step, seen[0].phase, seen[1].phase) == (5, phases.VOTE.label, phases.OPTIMIZER.label)
    assert (seen[0].pid, seen[1].pid) == (100, 101)
    assert 0.3 <= seen[0].age < 10


def test_reading_a_store_nobody_serves_gives_none_within_its_timeout():
    port = free_port()  # nobody listens there: refused at once
    started = time.monotonic()
    assert read_store("127.0.0.1", port, timeout=1.0) is None
    assert time.monotonic() - started < 5


def test_only_a_stopped_rank_on_this_host_that_is_still_a_harness_process_is_ended():
    """end_frozen_here never signals another host's pid, its own process, or a pid that is gone
    (tests/integration/test_stuck_rank.py shows a frozen rank on the host ended)."""
    here = socket.gethostname()
    stale = [
        Seen(0, "elsewhere", 5, phases.OPTIMIZER.label, 12.0, pid=os.getppid()),
        Seen(1, here, 5, phases.OPTIMIZER.label, 12.0, pid=os.getpid()),
        Seen(2, here, 5, phases.OPTIMIZER.label, 12.0, pid=2**31 - 1),  # above any pid_max: no such process
        Seen(3, here, 5, phases.OPTIMIZER.label, 12.0),  # an old store's beat without a pid
    ]
    assert heartbeat.end_frozen_here(stale, here) == []


def test_a_rank_waiting_in_a_collective_names_it_in_its_phase():
    """The meter tells the heartbeat when the host waits for a collective: its phase then names the
    collective, and the rank furthest behind is judged by the phase the collective is in."""
    from harness.backends.collectives import CollectiveMeter

    pulse = heartbeat.Heartbeat()  # not started: beats only set where this rank is
    meter = CollectiveMeter(listener=pulse.in_collective)
    pulse.beat(4, phases.OPTIMIZER.label)
    with meter.waiting(meter.issued("all_gather", 1024)):
        assert pulse._latest == (4, "optimizer, waiting in all_gather")
    assert pulse._latest == (4, phases.OPTIMIZER.label)
    seen = {
        0: _seen(0, 0.3, step=6, phase=f"{phases.VOTE.label}{heartbeat.WAITING_IN}all_reduce"),
        1: _seen(1, 0.5, step=6, phase=f"{phases.FORWARD.label}{heartbeat.WAITING_IN}all_reduce"),
    }
    line = describe(seen, world_size=2, timeout=10, store_host="node1", reader=0)
    assert line.endswith(
        "furthest behind: rank 1 (host node1, step 6, forward/backward, waiting in all_reduce, last seen 0.5 s ago)"
    )
