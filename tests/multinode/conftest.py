"""The namespace cluster as a fixture: a fresh one per test (it starts in well under a second), torn
down by the fixture's finalizer, and from its record by the next start if this process is killed."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Optional

import pytest

from tests.helpers.slurm_cluster import SlurmUnavailable, check_installed

from .netns_cluster import NamespacesUnavailable, NetnsCluster, check_namespaces
from .slurm_nodes import NamespaceSlurm

NODES = 2


@functools.cache
def _why_no_namespaces() -> Optional[str]:
    try:
        check_namespaces()
    except NamespacesUnavailable as exc:
        return str(exc)
    return None


@pytest.fixture(autouse=True, scope="session")
def _needs_namespaces() -> None:
    """Skip, with the one-line reason, only where this machine does not allow network namespaces."""
    reason = _why_no_namespaces()
    if reason:
        pytest.skip(f"multi-node tests need network namespaces: {reason}")


@pytest.fixture
def cluster(tmp_path) -> Iterator[NetnsCluster]:
    """NODES nodes, node1 ... nodeN, on a private bridge."""
    with NetnsCluster(NODES, str(tmp_path / "cluster")) as started:
        yield started


@pytest.fixture
def slurm(cluster, tmp_path) -> Iterator[NamespaceSlurm]:
    """A real Slurm across `cluster`'s nodes (slurm_nodes.py), stopped after the test, failed or not."""
    try:
        check_installed()
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    started = NamespaceSlurm(cluster, str(tmp_path / "slurm")).start()
    try:
        yield started
    finally:
        started.stop()
