"""Rank 0's host under horovodrun across nodes, found through horovodrun's own rendezvous server.

horovodrun exports no variable naming rank 0's host, and until the multi-node tests ran a job on two
nodes (tests/multinode/), every rank of a multi-node horovodrun job failed discovery ("cannot tell
rank 0's host"), whatever the backend. Rank 0 now puts its hostname into the rendezvous server's
key-value store and the others read it; here against the server horovodrun itself runs.
"""

from __future__ import annotations

import socket
import threading

import pytest

from harness.errors import UsageError
from harness.process import discovery
from harness.process.discovery import detect_cluster

pytest.importorskip("horovod.runner.http.http_server", reason="Horovod is not installed (run `make setup`)")
from horovod.runner.http.http_server import RendezvousServer  # noqa: E402


def _rank_environ(rank: int, port: int) -> dict[str, str]:
    """What horovodrun --gloo exports to rank `rank` of 2 nodes x 2 (without MASTER_ADDR)."""
    return {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": "4",
        "HOROVOD_LOCAL_RANK": str(rank % 2),
        "HOROVOD_LOCAL_SIZE": "2",
        "HOROVOD_CROSS_RANK": str(rank // 2),
        "HOROVOD_CROSS_SIZE": "2",
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
    }


@pytest.fixture
def rendezvous_port():
    server = RendezvousServer()
    port = server.start()
    yield port
    server.stop()


def test_every_rank_gets_rank_0s_hostname_from_horovodruns_rendezvous(rendezvous_port):
    found = {}
    waiting = threading.Thread(
        target=lambda: found.update(
            rank3=detect_cluster(_rank_environ(3, rendezvous_port), mpi_hostname=lambda: pytest.fail("not MPI"))
        )
    )
    waiting.start()  # a rank that asks before rank 0 has published waits for it
    rank0 = detect_cluster(_rank_environ(0, rendezvous_port))
    waiting.join(timeout=30)
    assert rank0.master_addr == socket.gethostname()
    assert found["rank3"].master_addr == socket.gethostname()
    assert (found["rank3"].rank, found["rank3"].local_rank, found["rank3"].launcher) == (3, 1, "horovodrun")


def test_a_rank_0_that_never_publishes_is_a_one_line_error(rendezvous_port, monkeypatch):
    monkeypatch.setattr(discovery, "HOROVODRUN_EXCHANGE_TIMEOUT_S", 0.5)
    with pytest.raises(UsageError, match="rank 0 did not publish its hostname .* export MASTER_ADDR"):
        detect_cluster(_rank_environ(1, rendezvous_port))


def test_master_addr_and_one_node_need_no_rendezvous():
    environ = _rank_environ(1, 1)  # port 1: nothing listens, so any request would fail
    assert detect_cluster({**environ, "MASTER_ADDR": "node7"}).master_addr == "node7"
    assert detect_cluster({**environ, "HOROVOD_SIZE": "2"}).master_addr == "127.0.0.1"
