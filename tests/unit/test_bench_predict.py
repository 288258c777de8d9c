"""`harness bench allreduce`'s fit of the ring model, and `harness predict`, on numbers worked out by hand."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from harness.errors import UsageError
from harness.study.prediction.allreduce import fit_alpha_beta, parse_sizes, ring_allreduce_seconds
from harness.study.prediction.predict import (
    Network,
    Workload,
    measured_steps,
    network_from_bench,
    network_from_site,
    predict_scaling,
    prediction_table,
    workload_from_records,
)
from tests.helpers.handmade_records import record

SIZES = [4096 * 4**k for k in range(9)]


@pytest.mark.parametrize("ranks, alpha, busbw", [(2, 20e-6, 5e9), (4, 3.4e-6, 200e9), (16, 1.4e-5, 40e9)])
def test_the_fit_recovers_alpha_and_busbw_of_exact_timings(ranks, alpha, busbw):
    seconds = [2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * size / busbw for size in SIZES]
    fit = fit_alpha_beta(SIZES, seconds, ranks)
    assert fit["alpha_s"] == pytest.approx(alpha, rel=1e-9)
    assert fit["busbw_bytes_per_s"] == pytest.approx(busbw, rel=1e-9)
    assert fit["steps"] == 2 * (ranks - 1) and fit["max_relative_error"] < 1e-9


def test_the_fit_weighs_every_size_alike_under_noise():
    noise = random.Random(7)
    alpha, busbw = 50e-6, 2e9
    seconds = [ring_allreduce_seconds(size, 2, alpha, busbw) * noise.uniform(0.95, 1.05) for size in SIZES]
    fit = fit_alpha_beta(SIZES, seconds, 2)
    # Unweighted least squares would let the 256 MiB point swamp the latency; relative errors do not.
    assert fit["alpha_s"] == pytest.approx(alpha, rel=0.15)
    assert fit["busbw_bytes_per_s"] == pytest.approx(busbw, rel=0.10)


def test_nothing_to_fit_at_one_rank_and_no_negative_latency():
    assert fit_alpha_beta(SIZES, [1e-3] * len(SIZES), 1) is None
    assert ring_allreduce_seconds(1e6, 1, 1e-5, 1e9) == 0.0
    # Times proportional to size: latency fitted as zero, not as a negative number.
    fit = fit_alpha_beta([1e6, 2e6, 4e6], [1e-3 * 0.999, 2e-3 * 1.001, 4e-3], 2)
    assert fit["alpha_s"] == 0.0 and fit["busbw_bytes_per_s"] == pytest.approx(1e9, rel=0.01)


def test_sizes_read_like_a_person_writes_them():
    assert parse_sizes("1M, 4K,256M,4096") == [4096, 2**20, 256 * 2**20]
    with pytest.raises(UsageError, match="--sizes takes sizes such as 4K,1M,256M; got 'lots'"):
        parse_sizes("4K,lots")


NETWORK = Network(
    "hand",
    ranks_per_node=2,
    alpha_intra_s=1e-5,
    alpha_inter_s=1e-4,
    base_latency_s=0.0,
    busbw_intra=10e9,
    busbw_inter=1e9,
    source="by hand",
)
WORK = Workload(
    compute_s=0.1,
    backward_s=0.06,
    overhead_s=0.0,
    gradient_bytes=100_000_000,
    bucket_bytes=50_000_000,
    overlap=1.0,
    local_batch=32,
    source="by hand",
)


def test_predict_by_hand_on_one_and_two_nodes():
    one, two = predict_scaling(WORK, NETWORK, [1, 2])
    # One node, 2 ranks: a bucket takes 2 x 10 us + (2 x 1/2) x 50 MB / 10 GB/s = 5.02 ms. The first
    # is ready halfway through the 60 ms backward and done long before its end; the second starts
    # at the end of the backward: 5.02 ms exposed.
    assert one["allreduce_s"] == pytest.approx(2 * 0.00502)
    assert one["exposed_s"] == pytest.approx(0.00502)
    assert one["step_s"] == pytest.approx(0.10502) and one["efficiency"] == pytest.approx(0.1 / 0.10502)
    assert one["throughput"] == pytest.approx(2 * 32 / 0.10502)
    # Two nodes, 4 ranks: 6 steps, 2 across nodes: 4 x 10 us + 2 x 100 us + (2 x 3/4) x 50 MB / 1 GB/s
    # = 75.24 ms a bucket; the first ends at 30 + 75.24 ms, the second starts then and ends at 180.48 ms.
    assert two["ranks"] == 4 and two["allreduce_s"] == pytest.approx(2 * 0.07524)
    assert two["exposed_s"] == pytest.approx(0.18048 - 0.06)


def test_no_overlap_sends_everything_after_the_backward_and_one_rank_sends_nothing():
    late = Workload(**{**WORK.__dict__, "overlap": 0.0})
    assert predict_scaling(late, NETWORK, [2])[0]["exposed_s"] == pytest.approx(2 * 0.07524)
    alone = Network(**{**NETWORK.__dict__, "ranks_per_node": 1})
    assert predict_scaling(WORK, alone, [1])[0] == {
        "nodes": 1,
        "ranks": 1,
        "allreduce_s": 0.0,
        "exposed_s": 0.0,
        "step_s": 0.1,
        "throughput": 320.0,
        "efficiency": 1.0,
        "algorithms": "",
    }


def test_site_figures_come_from_the_profile():
    polaris, perlmutter = network_from_site("polaris"), network_from_site("perlmutter")
    assert polaris.ranks_per_node == 4 and perlmutter.ranks_per_node == 4
    assert polaris.model.inter_gbytes_per_s == pytest.approx(2 * 25 * 0.8)  # a pair of 25 GB/s NICs at 80%
    assert perlmutter.model.inter_gbytes_per_s == pytest.approx(4 * 25 * 0.8)
    assert polaris.busbw_intra == pytest.approx(300e9 * 0.8) and polaris.model.cpu_vendor == "amd"
    with pytest.raises(UsageError, match="has no network figures"):
        network_from_site("generic-slurm")


def test_a_benchmark_across_nodes_gives_the_network_figures():
    bench = {
        "backend": "ddp",
        "world_size": 3,
        "nodes": 3,
        "ranks_per_node": 1,
        "hostname": "node1",
        "fit": {"alpha_s": 2e-4, "busbw_bytes_per_s": 1.2e7},
    }
    network = network_from_bench(bench)
    assert (network.ranks_per_node, network.alpha_inter_s, network.busbw_inter) == (1, 2e-4, 1.2e7)
    assert network.busbw(3) == 1.2e7 and network.base_latency_s == 0.0
    with pytest.raises(UsageError, match="no fit"):
        network_from_bench({**bench, "fit": None})


def _measured_run(world_size, runtime, repeat=0):
    run = record("ddp", world_size, 100.0 * world_size, repeat=repeat)
    run["step_breakdown"]["seconds_per_step"] = {
        "runtime": runtime,
        "forward_backward": 0.06,
        "optimizer": 0.01,
        "data_wait": 0.002,
        "other": 0.003,
        "communication": 0.0,
    }
    run["step_breakdown"]["timed_steps"] = 10
    run.update(local_world_size=1, gradient_bytes=4_799_528, tuning={"bucket_cap_mb": 25.0})
    return run


def test_workload_and_measured_steps_from_records():
    runs = [_measured_run(1, 0.075), _measured_run(1, 0.077, 1), _measured_run(2, 0.1), _measured_run(2, 0.11, 1)]
    work = workload_from_records(runs, overlap=1.0, bucket_mb=None)
    assert work.compute_s == pytest.approx(0.07) and work.overhead_s == pytest.approx(0.005)
    assert work.backward_s == pytest.approx(0.04) and work.buckets() == [4_799_528]
    assert work.local_batch == 64
    measured = measured_steps(runs)  # by world size
    assert measured[1]["mean"] == pytest.approx((0.075 * 0.077) ** 0.5) and measured[2]["n"] == 2
    assert measured[1]["interval"] is None  # two runs: no interval (harness.study.scaling.intervals.MIN_ROUNDS)
    assert measured[2]["contended"] is False
    table = prediction_table(
        predict_scaling(
            work,
            network_from_bench(
                {
                    "backend": "ddp",
                    "world_size": 2,
                    "nodes": 2,
                    "ranks_per_node": 1,
                    "fit": {"alpha_s": 1e-4, "busbw_bytes_per_s": 1e8},
                }
            ),
            [1, 2],
        ),
        measured,
    )
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    # One node: 70 ms compute + 5 ms overhead predicted, 76 ms measured.
    assert rows[0][0] == "1" and rows[0][4] == "75" and rows[0][7] == "75.99" and rows[0][9] == "-1.3%"
    assert rows[0][8] == "n/a (needs 3 rounds)"  # two runs give no interval


def test_the_prediction_figure_boxes_contended_measurements_and_shows_anchors():
    from harness.study.scaling.plot import CONTENTION_LABEL
    from harness.study.scaling.run_plots import prediction_figure

    rows = predict_scaling(WORK, NETWORK, [1, 2])  # 2 and 4 ranks
    measured = {
        2: {"mean": 0.11, "interval": (0.1, 0.12), "contended": True},
        4: {"mean": 0.2, "interval": None},
        8: {"mean": 0.3, "interval": None},
    }  # 8 ranks: not predicted, left out
    figure = prediction_figure(rows, measured, "by hand", [{"nodes": 2, "efficiency": 0.8, "label": "published"}])
    step_axis, efficiency_axis = figure.axes
    assert CONTENTION_LABEL in [text.get_text() for text in step_axis.get_legend().get_texts()]
    assert "published" in [text.get_text() for text in efficiency_axis.get_legend().get_texts()]
    assert figure.harness_metadata["anchors"][0]["efficiency"] == 0.8


def test_traffic_is_priced_on_the_tasks_own_model(tmp_path):
    from harness.backends.traffic import ModelShape
    from harness.cli import main
    from harness.study.prediction.predict import backend_traffic
    from harness.study.prediction.predict_cli import with_node_and_traffic
    from harness.training.plan import model_shape, shape_record
    from tests.conftest import REPO
    from tests.helpers.tasks import regression

    model = regression(width=64).build_model()
    shape = model_shape(model)
    out = tmp_path / "prediction.json"
    published = ["predict", "--site", "polaris", "--throughput", "2470", "--batch-size", "256", "--nodes", "1,2"]

    def predicted(*flags: str) -> dict:
        assert main([*published, *flags, "--backend", "fsdp", "--json", str(out)]) == 0
        return json.loads(out.read_text())["workload"]

    # Without records: the task the flags name, its model built here as a run builds it.
    spec = f"{REPO}/tests/helpers/tasks.py:regression"
    workload = predicted("--task", spec, "--task-arg", "width=64")
    # Its memory per rank too, per node count (4 ranks a Polaris node): FSDP shards the state over them.
    memory = json.loads(out.read_text())["memory"]
    assert [(row["nodes"], row["ranks"]) for row in memory] == [(1, 4), (2, 8)]
    assert memory[1]["model_state_bytes"] < memory[0]["model_state_bytes"] < 3 * shape.parameter_bytes
    assert all(list(row["fits"].values()) == [True] and row["backend"].startswith("fsdp") for row in memory)
    assert workload["gradient_bytes"] == shape.parameter_bytes
    assert workload["calls"] == [dataclasses.asdict(call) for call in backend_traffic("fsdp", {}, shape)]
    assert len(workload["calls"]) == 3 * 3  # per unit (three layers with parameters): 2 all-gathers, 1 reduce-scatter
    # The images task by its own flag, as before tasks: the CNN's 4.8 MB.
    assert predicted("--model", "cnn")["gradient_bytes"] == 4_799_528
    # From records: the shape the run recorded (record["task"]), here on the CPU.
    run = _measured_run(1, 0.075)
    run.update(backend="fsdp", gradient_bytes=shape.parameter_bytes, task={"spec": spec, **shape_record(model)})
    priced = with_node_and_traffic(workload_from_records([run], 1.0, None), [run], 1)
    assert priced.calls == tuple(backend_traffic("fsdp", {}, shape, on_gpu=False))
    # A record made before tasks: the images task's model of that name (the CNN: two units), not one unit.
    legacy = _measured_run(1, 0.075)
    legacy.update(backend="fsdp", gradient_bytes=4_799_528)
    calls = with_node_and_traffic(workload_from_records([legacy], 1.0, None), [legacy], 1).calls
    assert len(calls) == 3 * 2 and calls != tuple(backend_traffic("fsdp", {}, ModelShape(4_799_528), on_gpu=False))
