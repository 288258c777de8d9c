"""`harness predict` held out from its fit on two namespace nodes: the 2-node step of every
process-group backend predicted from its 1-node run and 2-node benchmarks of each collective,
against the measured 2-node step (benchmarks/prediction.py measures; each node's rank on a core
of its own). The machine's other load shares those cores, so the test asserts what holds under
it: every prediction within 35% (the committed benchmark reports the figures, goal 15%), and a
backend that moves more bytes per step predicted and measured slower."""

from __future__ import annotations

import os
import sys

import pytest

from harness.backends import BACKENDS
from harness.backends.torch_distributed import TorchDistributedBackend
from tests.conftest import REPO

sys.path.insert(0, REPO)
from benchmarks.prediction import compare, measure  # noqa: E402

# Alone: the measured two-node step, each rank on a core of its own, is compared with the prediction.
pytestmark = pytest.mark.alone

RATE_MBIT = 200.0
SIZES = "64K,1M,8M"  # fewer than the benchmark's: the calls between them read off straight lines
PROCESS_GROUP = [
    (name, ["--backend", name]) for name, cls in sorted(BACKENDS.items()) if issubclass(cls, TorchDistributedBackend)
]


@pytest.mark.timeout(900)
def test_the_two_node_step_is_predicted_from_one_node_and_a_benchmark(tmp_path):
    out = str(tmp_path / "prediction")
    os.makedirs(out)
    measure(out, repeats=1, steps=15, rates=(RATE_MBIT,), backends=PROCESS_GROUP, sizes=SIZES)
    rows = compare(out, rates=(RATE_MBIT,), backends=PROCESS_GROUP)["rows"]
    assert sorted(row["backend"] for row in rows) == sorted(name for name, _ in PROCESS_GROUP)
    for row in rows:
        assert abs(row["error"]) < 0.35, row
    by_predicted = sorted(rows, key=lambda row: row["predicted"]["step_s"])
    slowest, fastest = by_predicted[-1], by_predicted[0]
    if slowest["predicted"]["step_s"] > 1.5 * fastest["predicted"]["step_s"]:
        assert slowest["measured"]["mean"] > fastest["measured"]["mean"]
