"""Speedup, efficiency and POP arithmetic, on hand-made numbers and records."""

from __future__ import annotations

import pytest

from harness.study.scaling.report import scaling_report, scaling_rows
from harness.training.metrics import (
    DEFINITIONS,
    POP_KEYS,
    accelerator_utilisation,
    communication_efficiency,
    computation_scalability,
    global_efficiency,
    load_balance,
    parallel_efficiency,
    pop_metrics,
    rank_breakdown,
    scaling_efficiency,
    speedup,
)
from tests.helpers.handmade_records import record, weak_study


def test_weak_scaling_speedup_and_efficiency_are_throughput_ratios():
    assert speedup(1800.0, 1000.0) == pytest.approx(1.8)
    assert scaling_efficiency(1800.0, 2, 1000.0) == pytest.approx(0.9)
    assert scaling_efficiency(4000.0, 4, 1000.0) == pytest.approx(1.0)
    # A study that starts at 4 workers measures scaling relative to 4.
    assert scaling_efficiency(6000.0, 8, 4000.0, baseline_workers=4) == pytest.approx(0.75)
    assert speedup(1800.0, 0.0) is None


def test_perfectly_balanced_ranks():
    useful, runtime = [2.0, 2.0, 2.0, 2.0], 2.5
    assert load_balance(useful) == pytest.approx(1.0)
    assert communication_efficiency(useful, runtime) == pytest.approx(0.8)
    assert parallel_efficiency(useful, runtime) == pytest.approx(0.8)


def test_imbalanced_ranks():
    useful, runtime = [1.0, 2.0, 3.0, 2.0], 4.0
    metrics = pop_metrics(useful, runtime)
    assert metrics["load_balance"] == pytest.approx(2.0 / 3.0)  # mean 2 / max 3
    assert metrics["communication_efficiency"] == pytest.approx(0.75)  # max 3 / runtime 4
    # The model is multiplicative: the product is mean(useful) / runtime.
    assert metrics["parallel_efficiency"] == pytest.approx(0.5)
    product = metrics["load_balance"] * metrics["communication_efficiency"]
    assert metrics["parallel_efficiency"] == pytest.approx(product)


def test_pop_metrics_of_nothing_are_unknown_not_zero():
    assert pop_metrics([], 1.0) == dict.fromkeys(POP_KEYS)
    assert load_balance([0.0, 0.0]) is None


def test_rank_breakdown_adds_up_to_the_window_and_useful_time_is_compute():
    parts = rank_breakdown(runtime=10.0, data_wait=1.0, forward_backward=5.0, communication=2.0, optimizer=1.5)
    assert parts["useful"] == pytest.approx(6.5)  # compute + optimizer; waiting and communication excluded
    assert parts["other"] == pytest.approx(0.5)
    total = sum(parts[k] for k in ("data_wait", "forward_backward", "communication", "optimizer", "other"))
    assert total == pytest.approx(parts["runtime"])
    # Phases measured inside the window never leave a negative remainder, even with clock granularity.
    assert rank_breakdown(1.0, 0.0, 0.8, 0.1, 0.100001)["other"] == 0.0


def test_accelerator_utilisation_is_compute_time_over_total_time():
    parts = rank_breakdown(runtime=4.0, data_wait=1.0, forward_backward=1.5, communication=0.5, optimizer=0.5)
    compute = parts["forward_backward"] + parts["communication"] + parts["optimizer"]
    assert accelerator_utilisation(compute, parts["runtime"]) == pytest.approx(0.625)  # 2.5 of 4
    # Communication is part of a step's compute (as in DLIO): a rank that communicates half its
    # window and never waits for data still has AU 1; the POP metrics count it.
    parts = rank_breakdown(runtime=4.0, data_wait=0.0, forward_backward=1.5, communication=2.0, optimizer=0.5)
    assert accelerator_utilisation(4.0, parts["runtime"]) == 1.0
    assert pop_metrics([parts["useful"]], parts["runtime"])["communication_efficiency"] == pytest.approx(0.5)
    assert accelerator_utilisation(0.0, 0.0) is None


def test_computation_scalability_and_global_efficiency():
    # Weak scaling: each rank computes as much at every N; 0.10 s per step at 1, 0.125 s at 4.
    assert computation_scalability(0.125, 4, 0.10, 1, "weak") == pytest.approx(0.8)
    # Strong scaling: the same samples at every N; 4 ranks x 0.03 s against 1 x 0.10 s.
    assert computation_scalability(0.03, 4, 0.10, 1, "strong") == pytest.approx(0.10 / 0.12)
    assert global_efficiency(0.9, 0.8) == pytest.approx(0.72)
    assert global_efficiency(None, 0.8) is None


def test_transfer_and_serialisation_bounds_multiply_to_communication_efficiency():
    metrics = pop_metrics([3.0, 2.0], 4.0, communication=[0.5, 1.5])
    assert metrics["transfer_efficiency_bound"] == pytest.approx(3.5 / 4.0)  # the least wait, 0.5 s
    product = metrics["transfer_efficiency_bound"] * metrics["serialisation_efficiency_bound"]
    assert product == pytest.approx(metrics["communication_efficiency"])


def test_every_metric_has_one_definition_in_the_metrics_docstring():
    import harness.training.metrics as metrics

    for term in (
        "AU",
        "communication",
        "useful time",
        "load balance",
        "communication efficiency",
        "parallel efficiency",
        "scaling efficiency",
        "contention",
    ):
        assert DEFINITIONS[term].startswith(f"**{term}**")
        assert " ".join(DEFINITIONS[term].split()) in " ".join(metrics.__doc__.split())


def test_scaling_rows_aggregate_repeats_and_use_each_backends_own_baseline():
    rows = {(row.backend, row.workers): row for row in scaling_rows(weak_study())}
    assert set(rows) == {
        ("none", 1),
        ("ddp", 1),
        ("ddp", 2),
        ("horovod", 1),
        ("horovod", 2),
        ("deepspeed", 1),
        ("deepspeed", 2),
    }
    ddp2 = rows["ddp", 2]
    assert ddp2.runs == 2 and ddp2.throughput == pytest.approx(1700.0)
    # Two repeats 1710 and 1690: fewer than intervals.MIN_ROUNDS, so no interval at all.
    assert ddp2.throughput_interval is None
    assert ddp2.speedup == pytest.approx(1700.0 / 950.0)
    assert ddp2.efficiency == pytest.approx(1700.0 / 950.0 / 2)
    assert rows["horovod", 2].efficiency == pytest.approx(0.8)
    assert rows["deepspeed", 2].load_balance == pytest.approx(0.75)  # mean(0.4, 0.8) / 0.8
    assert rows["deepspeed", 1].efficiency == pytest.approx(1.0)


def test_a_backend_with_other_options_is_another_configuration_with_its_own_baseline_and_memory():
    """ZeRO stages in one results file: each stage its own rows, efficiency against its own 1-worker
    run, memory per rank beside throughput; a default spelled out is the default."""
    stages = [
        record("deepspeed", 1, 800.0, state_mib=[18.0]),
        record("deepspeed", 2, 1200.0, state_mib=[18.0, 18.0]),
        record("deepspeed", 1, 700.0, options={"zero_stage": 3}, state_mib=[18.0]),
        record("deepspeed", 2, 1260.0, options={"zero_stage": 3}, state_mib=[9.0, 9.5]),
        record("deepspeed", 2, 1180.0, options={"zero_stage": 0}, state_mib=[18.0, 18.0], repeat=1),
    ]
    rows = {(row.backend, row.workers): row for row in scaling_rows(stages)}
    assert set(rows) == {
        ("deepspeed", 1),
        ("deepspeed", 2),
        ("deepspeed zero_stage=3", 1),
        ("deepspeed zero_stage=3", 2),
    }
    assert rows["deepspeed", 2].runs == 2 and rows["deepspeed", 2].efficiency == pytest.approx(1190.0 / 800.0 / 2)
    assert rows["deepspeed zero_stage=3", 2].efficiency == pytest.approx(1260.0 / 700.0 / 2)
    assert rows["deepspeed zero_stage=3", 2].model_state_mib == pytest.approx(9.5)
    assert rows["deepspeed zero_stage=3", 2].peak_mib == pytest.approx(709.5)
    lines = [line for line in scaling_report(stages).splitlines() if line.startswith("| deepspeed zero_stage=3")]
    assert len(lines) == 2 and [cell.strip() for cell in lines[1].strip("| ").split("|")][-2:] == ["9.5", "709.5"]


def test_weak_and_strong_studies_are_never_mixed():
    records = weak_study() + [
        record("ddp", 1, 900.0, scaling="strong", local_batch=128),
        record("ddp", 2, 1600.0, scaling="strong", local_batch=64),
    ]
    strong = [row for row in scaling_rows(records) if row.study.scaling == "strong"]
    assert [(row.workers, row.study.batch) for row in strong] == [(1, 128), (2, 128)]  # one global batch
    assert strong[1].efficiency == pytest.approx(1600.0 / 900.0 / 2)


def test_report_prints_every_configuration_with_its_metrics():
    text = scaling_report(weak_study(), explain=True)
    assert "### Weak scaling: cnn on synthetic, 64 samples per worker" in text
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = lines[0]
    for column in (
        "samples/s [95%]",
        "speedup [95%]",
        "efficiency [95%]",
        "vs common baseline [95%]",
        "AU",
        "load balance",
        "comm. efficiency",
        "parallel efficiency",
    ):
        assert column in header
    body = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert {(cells[0], cells[1]) for cells in body} == {
        ("none", "1"),
        ("ddp", "1"),
        ("ddp", "2"),
        ("horovod", "1"),
        ("horovod", "2"),
        ("deepspeed", "1"),
        ("deepspeed", "2"),
    }
    ddp2 = next(cells for cells in body if cells[:2] == ["ddp", "2"])
    assert ddp2[2] == "1" and ddp2[4] == "1,700 [n/a (needs 3 rounds)]" and ddp2[6] == "0.8947 [n/a (needs 3 rounds)]"
    assert ddp2[7] == "0.85 [n/a (needs 3 rounds)]"  # against the common baseline, `none` x1 at 1,000 samples/s
    assert "x2: ddp, horovod, deepspeed: not resolved at 1 repeats (an interval needs 3 rounds): no ranking" in text
    assert next(cells for cells in body if cells[:2] == ["none", "1"])[4] == "1,000 [n/a (needs 3 rounds)]"
    assert "n/a (needs 3 rounds): 7 of 7 row(s) ran in 1 round(s), too few for a 95% interval" in text
    for term in ("AU", "communication efficiency", "contention"):
        assert DEFINITIONS[term] in text  # --explain prints the metrics module's definition
    assert DEFINITIONS["AU"] not in scaling_report(weak_study())  # without it, one line says where to read it
