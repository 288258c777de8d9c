"""The POP and contention numbers verified by injection: a known delay in one rank's compute, and a
CPU-bound process on the job's own cores.

The machine these run on is shared, so nothing here assumes it is idle: the load-balance check
derives its expectation from what the ranks measured and what the injected waits really took, and
the contention checks compare the verdict with an outside-load reading the test takes itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.process.launchers import launcher_command
from harness.training.contention import usable_cpus
from harness.training.metrics import OUTSIDE_LOAD_ABOVE
from harness.training.record import read_records
from tests.conftest import launch, run
from tests.helpers.backend_cases import DISTRIBUTED
from tests.helpers.machine_load import outside_share

# Alone: the contention verdicts are compared with the machine's load, which a second lane would raise.
pytestmark = pytest.mark.alone

SLOW_RANK_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "helpers", "slow_rank_model.py")
DELAY = 0.15  # s per forward pass on rank 1: many times the CNN's compute on 8 digits
# How far the measured load balance may sit from the expectation: the expectation takes rank 0's
# compute for rank 1's too, and on a loaded machine two ranks' compute differs by up to a few tens
# of ms per step (0.03 s / (2 x 0.17 s) ~ 0.09).
BALANCE_TOLERANCE = 0.1
RUN_FLAGS = ["--model", "cnn", "--dataset", "synthetic", "--threads", "1", "--max-steps", "60", "--eval-every", "0"]


@pytest.mark.slow
def test_a_delay_in_one_ranks_compute_lowers_load_balance_by_the_amount_expected(tmp_path):
    """Rank 1's forward waits DELAY s per step; rank 0 computes only. With c = rank 0's useful time
    per step and d = the waits' measured mean, load balance = mean / max = (2c + d) / (2 (c + d))."""
    result = run(
        launcher_command(
            "torchrun",
            2,
            [
                SLOW_RANK_SCRIPT,
                str(tmp_path),
                f"0,{DELAY * 1000:g}",
                *["--backend", DISTRIBUTED[0], "--dataset", "digits", "--batch-size", "8", "--max-steps", "20"],
                *["--timing-warmup-steps", "5", "--threads", "1", "--eval-every", "0", "--calibration-steps", "0"],
            ],
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    record = ranks[0]["record"]
    steps = record["timed_steps"]
    useful = [seconds / steps for seconds in record["step_breakdown"]["per_rank_seconds"]["useful"]]
    timed_waits = ranks[1]["waits"][-steps:]  # the last `steps` forward passes are the timed ones
    compute, delay = useful[0], sum(timed_waits) / len(timed_waits)
    expected = (2 * compute + delay) / (2 * (compute + delay))
    print(
        f"useful s/step {useful}, waits {delay:.3f} s/step: load balance {record['load_balance']:.3f}, expected {expected:.3f}"
    )
    assert delay >= DELAY and useful[1] >= delay, (useful, delay)
    assert record["load_balance"] == pytest.approx(expected, abs=BALANCE_TOLERANCE), (useful, delay, expected)
    assert record["load_balance"] < 0.75  # far from the balanced run's ~1.0 (test_pop_measurement)


def _contention(tmp_path, name: str) -> dict:
    results = tmp_path / f"{name}.jsonl"
    launch(2, DISTRIBUTED[0], [*RUN_FLAGS, "--results", str(results)])
    return read_records([str(results)])[0]["contention"]


@pytest.mark.slow
def test_an_idle_two_rank_run_is_flagged_only_as_far_as_other_processes_load_the_machine(tmp_path):
    """Two ranks on two cores oversubscribe them with their own communication threads: never a
    flag. The machine may be shared: the verdict must agree with the outside load measured by the
    test just before and just after the run."""
    before = outside_share(3.0)
    contention = _contention(tmp_path, "idle")
    after = outside_share(3.0)
    measured = contention["outside_cpu_share"]
    print(f"outside load: {before:.0%} before, {measured:.0%} in the run, {after:.0%} after: {contention['reasons']}")
    assert "oversubscription" in contention and "rank(s) x" in contention["oversubscription"]
    assert contention["flagged"] == (measured > OUTSIDE_LOAD_ABOVE)
    if max(before, after) < OUTSIDE_LOAD_ABOVE / 2:  # a quiet machine around the run: not flagged
        assert not contention["flagged"], contention
    if min(before, after) > 3 * OUTSIDE_LOAD_ABOVE:  # a busy machine throughout: flagged
        assert contention["flagged"], contention


@pytest.mark.slow
def test_the_same_run_beside_a_cpu_burner_on_its_cores_is_flagged(tmp_path):
    """One busy-looping process per usable CPU, pinned to the job's CPUs, takes a share of them
    whatever else runs: the run is flagged, and the share recorded is the burners' at least in part."""
    burners = []
    try:
        for cpu in usable_cpus():
            burners.append(
                subprocess.Popen(
                    [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
                )
            )
        contention = _contention(tmp_path, "loaded")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(timeout=30)
    print(f"beside {len(burners)} burner(s): {contention['outside_cpu_share']:.0%}: {contention['reasons']}")
    assert contention["flagged"], contention
    assert contention["outside_cpu_share"] > 2 * OUTSIDE_LOAD_ABOVE
    assert any(reason.startswith("other processes used") for reason in contention["reasons"])
