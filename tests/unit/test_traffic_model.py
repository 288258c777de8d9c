"""Each backend's declared traffic, NCCL's tuner model and the step timeline, on figures worked out
by hand (tuning.cc's constants), in process."""

from __future__ import annotations

import json

import pytest

from harness.backends import BACKENDS
from harness.backends.traffic import Collective, ModelShape, per_step
from harness.cli import main
from harness.study.prediction.nccl import NcclModel
from harness.study.prediction.predict import Network, Workload, predict_scaling
from harness.study.prediction.stepmodel import step_communication

SHAPE = ModelShape(100 * 2**20, unit_bytes=(30 * 2**20, 70 * 2**20), module_bytes=(10 * 2**20,) * 10)
POLARIS_LIKE = NcclModel("ampere", "amd", "nvlink", 8, 240.0, 40.0, ll128_across_nodes=False)
WIRE = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # x (n-1)/n x bytes per rank in a ring


def _option_sets():
    for name, cls in BACKENDS.items():
        for options in getattr(cls.Options, "examples", lambda: (cls.Options(),))():
            yield pytest.param(cls, options, id=f"{name}-{options}")


@pytest.mark.parametrize("cls, options", list(_option_sets()))
def test_every_backend_sends_the_gradient_once_and_the_weights_at_most_twice(cls, options):
    calls = cls(options).traffic(SHAPE)
    totals = per_step(calls)
    if cls.max_world_size == 1:
        assert calls == []
        return
    reduced = sum(totals.get(kind, {}).get("bytes", 0) for kind in ("all_reduce", "reduce_scatter"))
    assert reduced == SHAPE.parameter_bytes  # the whole gradient, averaged once
    gathered = totals.get("all_gather", {}).get("bytes", 0)
    assert gathered in (0, SHAPE.parameter_bytes, 2 * SHAPE.parameter_bytes)
    # The brief's per-rank ring traffic: 2(n-1)/n x S (allreduce, or reduce-scatter + all-gather)
    # or 3(n-1)/n x S (weights gathered in forward and again in backward).
    wire = sum(WIRE[call.kind] * call.bytes * call.count for call in calls) / SHAPE.parameter_bytes
    assert wire in (2, 3)
    assert all(call.phase != "forward_gather" or call.kind == "all_gather" for call in calls)


def test_the_gradient_bucket_fills_in_backward_order():
    from harness.backends.traffic import in_buckets

    calls = in_buckets("all_reduce", [10, 10, 30, 5], 25, "backward_reduce", True)
    assert [call.bytes for call in calls] == [20, 30, 5]


def test_nccl_ring_on_one_node_by_hand():
    # 4 ranks on NVLink, Simple: 8.4 us base + 6 steps x 3.4 us; algorithm bandwidth 240 x 4/6 GB/s.
    choice = POLARIS_LIKE.seconds("all_reduce", 100 * 2**20, 4, 1)
    assert (choice.algorithm, choice.protocol) == ("ring", "Simple")
    assert choice.seconds == pytest.approx((8.4 + 6 * 3.4 + 100 * 2**20 / (1000 * 160)) * 1e-6)


def test_nccl_picks_the_tree_at_scale_and_low_latency_protocols_for_small_messages():
    big = 25 * 2**20
    picks = {nodes: POLARIS_LIKE.seconds("all_reduce", big, 4 * nodes, nodes).algorithm for nodes in (1, 64, 512)}
    assert picks == {1: "ring", 64: "tree", 512: "tree"}
    # The tree's latency grows with log2 N: 512 nodes cost little more than 64, where a ring's
    # 2(N-1) network steps alone would take 1022 x 14 us.
    t64, t512 = (POLARIS_LIKE.seconds("all_reduce", big, 4 * n, n).seconds for n in (64, 512))
    assert t512 < 1.2 * t64 and t512 < 1022 * 14e-6
    assert POLARIS_LIKE.seconds("all_reduce", 4096, 8, 2).protocol == "LL"
    assert POLARIS_LIKE.seconds("all_gather", big, 8, 2).algorithm == "ring"  # no tree for all-gather
    assert POLARIS_LIKE.seconds("all_reduce", big, 1, 1).seconds == 0.0


def test_overlapped_gathers_hide_behind_compute_and_blocking_ones_do_not():
    def price(call: Collective) -> float:
        return 0.01

    gathers = [Collective("all_gather", 1, 4, "forward_gather", True)]
    hidden = step_communication(gathers, price, forward_s=0.1, backward_s=0.2, optimizer_s=0.0)
    # Prefetched one piece ahead: only the first gather (10 ms) waits; 4 x 10 ms in flight.
    assert hidden.total_s == pytest.approx(0.04) and hidden.exposed_s == pytest.approx(0.01)
    blocking = [Collective("all_gather", 1, 4, "forward_gather", False)]
    assert step_communication(blocking, price, 0.1, 0.2, 0.0).exposed_s == pytest.approx(0.04)
    after = [Collective("all_gather", 1, 2, "after_step", False)]
    assert step_communication(after, price, 0.1, 0.2, 0.05).exposed_s == pytest.approx(0.02)


NETWORK = Network("hand", 2, 1e-5, 1e-4, 0.0, 10e9, 1e9, "by hand")
WORK = Workload(0.1, 0.06, 0.0, 100_000_000, 50_000_000, 1.0, 32, "by hand")


def test_a_measured_node_keeps_its_own_step_and_adds_only_the_network():
    modelled = predict_scaling(WORK, NETWORK, [1, 2])
    measured = predict_scaling(Workload(**{**WORK.__dict__, "node_step_s": 0.13}), NETWORK, [1, 2])
    assert measured[0]["step_s"] == pytest.approx(0.13)
    # The node's own 25 ms above the model carry over; the network's share is the model's.
    assert measured[1]["step_s"] - measured[0]["step_s"] == pytest.approx(
        modelled[1]["step_s"] - modelled[0]["step_s"]
    )


def test_a_one_gpu_figure_says_node_efficiency_is_assumed_and_shows_the_anchors(tmp_path, capsys):
    out = tmp_path / "p.json"
    flags = ["predict", "--site", "polaris", "--throughput", "2470", "--batch-size", "256"]
    assert main([*flags, "--gradient-bytes", "102228128", "--nodes", "1,8,64,512", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "per-node efficiency assumed 1.0" in printed and "16,621 samples/s" in printed
    assert "NVIDIA/nccl src/graph/tuning.cc" in printed
    rows = json.loads(out.read_text())["predicted"]
    assert [row["algorithms"].split(":")[1].split("/")[0].strip() for row in rows] == ["ring", "ring", "tree", "tree"]


def test_bytes_per_kind_come_from_the_record_where_it_measured_them():
    from harness.study.prediction.predict_cli import with_node_and_traffic
    from tests.helpers.handmade_records import record

    backend = sorted(n for n, c in BACKENDS.items() if c.max_world_size is None)[0]
    run, alone = record(backend, 2, 100.0), record(backend, 1, 100.0)
    for one in (run, alone):
        one["step_breakdown"]["collectives"] = {
            kind: {"count": 1, "bytes": 3 * SHAPE.parameter_bytes, "seconds": 0.1, "exposed_seconds": 0.05}
            for kind in ("all_reduce", "all_gather", "reduce_scatter")
        }
    modelled = with_node_and_traffic(WORK, [], 1, run["backend"], {}, None)
    measured = with_node_and_traffic(WORK, [run], 1)
    assert "as the record measured" in measured.traffic_source and "modelled" in modelled.traffic_source
    # A rank alone sends little or nothing of what N ranks send: its record's bytes are not used.
    assert "modelled" in with_node_and_traffic(WORK, [alone], 1).traffic_source
    for kind, totals in per_step(measured.collectives()).items():
        assert totals["bytes"] == pytest.approx(3 * SHAPE.parameter_bytes, rel=1e-6)
        assert totals["count"] == per_step(modelled.collectives())[kind]["count"]


def test_zero3_gathers_a_weight_again_in_backward_only_when_deepspeed_would_free_it():
    from harness.backends.deepspeed import ZERO3_KEEP_GATHERED_ELEMENTS, DeepSpeedBackend

    zero3 = DeepSpeedBackend(DeepSpeedBackend.parse_options({"zero_stage": 3}))
    phases = [call.phase for call in zero3.traffic(SHAPE)]
    # The workshop CNN's 2-rank run gathers each weight once a step (DeepSpeed's reuse distance).
    assert phases.count("forward_gather") == len(SHAPE.modules()) and "backward_gather" not in phases
    huge = ModelShape(8 * ZERO3_KEEP_GATHERED_ELEMENTS, module_bytes=(4 * ZERO3_KEEP_GATHERED_ELEMENTS,) * 2)
    # The last module's backward follows its forward: only the first is freed and gathered again.
    assert [call.phase for call in zero3.traffic(huge)].count("backward_gather") == 1
    # The transformer of width 1024 (4 blocks; embeddings, LayerNorms and head between them) under
    # --zero-gathered-mb 4 at 2 ranks all-gathered 389,373,952 bytes a step: each module once in
    # forward, and again in backward all but the last two (the head, and the last linear layer, whose
    # reuse distance is the head's 262,144 elements twice).
    block = (8192, 12595200, 4198400, 8192, 16793600, 16781312)
    width_1024 = ModelShape(203776000, module_bytes=(1048576, 131072, *block * 4, 8192, 1048576))
    limited = DeepSpeedBackend(DeepSpeedBackend.parse_options({"zero_stage": 3, "zero_gathered_mb": 4}))
    gathered = sum(call.bytes for call in limited.traffic(width_1024) if call.kind == "all_gather")
    assert gathered == 2 * 203571200 - 16781312 - 1048576
    assert gathered == pytest.approx(389373952, rel=1e-3)


def test_fsdp_overlaps_its_calls_on_gpus_only():
    from harness.backends.fsdp import FSDPBackend

    fsdp = FSDPBackend(FSDPBackend.parse_options({}))
    assert all(call.overlapped for call in fsdp.traffic(SHAPE, on_gpu=True))
    assert not any(call.overlapped for call in fsdp.traffic(SHAPE, on_gpu=False))  # no CUDA streams


def test_a_measured_curve_is_read_between_its_sizes_and_extended_by_its_last_slope():
    from harness.study.prediction.predict import interpolated_seconds

    curve = ((1000, 0.002), (3000, 0.004), (5000, 0.010))
    assert interpolated_seconds(curve, 10) == 0.002  # latency-bound: no faster than the smallest
    assert interpolated_seconds(curve, 2000) == pytest.approx(0.003)
    assert interpolated_seconds(curve, 5000) == pytest.approx(0.010)
    assert interpolated_seconds(curve, 7000) == pytest.approx(0.016)


def test_a_benchmark_prices_its_own_sizes_as_it_measured_them():
    from harness.study.prediction.predict import network_from_benches

    def bench(kind, points):
        sizes = [{"bytes": size, "seconds": seconds} for size, seconds in points]
        fit = {"alpha_s": 1e-3, "busbw_bytes_per_s": 1e6}
        return {
            "backend": "ddp",
            "world_size": 2,
            "nodes": 2,
            "ranks_per_node": 1,
            "collective": kind,
            "sizes": sizes,
            "fit": fit,
        }

    network = network_from_benches(
        [bench("all_reduce", [(1e6, 0.5), (4e6, 3.0)]), bench("all_gather", [(1e6, 0.2), (4e6, 1.4)])]
    )
    assert network.seconds("all_gather", 4e6, 2, 2).seconds == pytest.approx(1.4)
    assert network.seconds("all_reduce", 2.5e6, 2, 2).seconds == pytest.approx(1.75)
    assert network.seconds("all_reduce", 2.5e6, 2, 2).algorithm == "measured all_reduce"
    # At 4 ranks: the bus bandwidth held ((n-1)/n from 1/2 to 3/4) and two more ring steps at alpha.
    assert network.seconds("all_gather", 4e6, 4, 4).seconds == pytest.approx(1.4 * 1.5 + 2 * 1e-3)
    assert any("measured times" in line for line in network.assumptions())


def test_ddp_closes_its_first_bucket_at_one_mib_as_its_reducer_does():
    import torch.distributed

    from harness.backends.ddp import FIRST_BUCKET_BYTES, DDPBackend

    assert FIRST_BUCKET_BYTES == torch.distributed._DEFAULT_FIRST_BUCKET_BYTES  # still torch's
    ddp = DDPBackend(DDPBackend.parse_options({}))
    # The workshop CNN's modules (conv1, conv2, fc1, fc2): fc2 and fc1 fill the first bucket, the
    # convolutions the second: the two allreduces a 2-rank run records.
    cnn = ModelShape(4_799_528, module_bytes=(1280, 73984, 4_719_104, 5160))
    assert [call.bytes for call in ddp.traffic(cnn)] == [5160 + 4_719_104, 73984 + 1280]


def test_ddp_overlaps_its_buckets_on_gpus_only():
    from harness.backends.ddp import DDPBackend

    ddp = DDPBackend(DDPBackend.parse_options({}))
    assert all(call.overlapped for call in ddp.traffic(SHAPE)) and not any(
        call.overlapped for call in ddp.traffic(SHAPE, on_gpu=False)
    )
