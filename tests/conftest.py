"""Shared helpers: run the real CLI and real launchers as subprocesses, with bounded timeouts."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Optional

import pytest

from harness.process.launchers import launch_environment
from harness.training.launch import launch_command

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH_TIMEOUT_S = 300


def run(
    command: Sequence[str],
    timeout: float = LAUNCH_TIMEOUT_S,
    env: Optional[dict[str, str]] = None,
    cwd: Optional[str] = None,
) -> subprocess.CompletedProcess:
    """Run a command to completion (or fail the test at `timeout`), capturing text output."""
    return subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO, env=launch_environment(env)
    )


def harness(*args: str, timeout: float = LAUNCH_TIMEOUT_S, env: Optional[dict[str, str]] = None):
    """`python -m harness ARGS` in a fresh process."""
    return run([sys.executable, "-m", "harness", *args], timeout=timeout, env=env)


def launch(
    ranks: int, backend: str, train_args: list[str], launcher: Optional[str] = None, timeout: float = LAUNCH_TIMEOUT_S
) -> subprocess.CompletedProcess:
    """`harness train` on `ranks` local processes through a real launcher; fails the test on error."""
    result = run(launch_command(ranks, backend, train_args, launcher), timeout=timeout)
    assert result.returncode == 0, (
        f"{backend} via {launcher}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    return result


@pytest.fixture(autouse=True)
def _no_stray_launcher_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run under plain pytest; a launcher's variables leaking in (e.g. from an sbatch shell)
    # would change what harness.process.discovery discovers.
    for name in list(os.environ):
        if name.startswith(("OMPI_COMM_WORLD", "PMI_", "PALS_", "SLURM_", "HOROVOD_", "PBS_")) or name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)


# The tiers that run real clusters (Slurm on this host or across namespace nodes, the emulated PBS) keep
# to one lane of `make test`, one after another: two namespace Slurm clusters in two lanes hung (both
# jobs waiting after 300 s). Every other test file runs whole in one lane, as `--dist loadfile` does.
ONE_LANE_TIERS = ("tests/scheduler/", "tests/multinode/")
# The order in which the lanes take the test files, longest first: the cluster tiers (one unit of work),
# the notebooks (minutes each), the integration tier, the unit tier (seconds in all) last to fill in.
LANE_TIER_ORDER = (*ONE_LANE_TIERS, "tests/notebooks/", "tests/integration/", "tests/unit/")


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # In the lanes only (an xdist worker; `make test` passes --no-loadscope-reorder, so they take the files
    # in this order): longest first, so that no long file is left for one lane at the end while the other
    # has nothing to do. Left to itself xdist would order the files by their number of tests, which put
    # the unit tier's files first and long integration files of few tests last.
    if not hasattr(config, "workerinput"):
        return
    slow_tests = Counter(_file_of(item) for item in items if item.get_closest_marker("slow"))

    def longest_first(item: pytest.Item) -> tuple[int, int, str]:
        path = _file_of(item)
        tier = next((rank for rank, tier in enumerate(LANE_TIER_ORDER) if path.startswith(tier)), len(LANE_TIER_ORDER))
        return tier, -slow_tests[path], path

    items.sort(key=longest_first)  # stable: a file's tests keep their order


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: called only when it runs the lanes
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ClusterTiersInOneLane(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "clusters" if nodeid.startswith(ONE_LANE_TIERS) else super()._split_scope(nodeid)

    return ClusterTiersInOneLane(config, log)
