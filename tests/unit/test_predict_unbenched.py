"""`harness predict` says which of a backend's collectives no benchmark timed (one warning each, with
the `harness bench` command that would time it, and the steps that priced it marked), and `harness
bench` given a backend times every collective that backend issues."""

from __future__ import annotations

import json

from harness.backends.traffic import ModelShape
from harness.cli import main
from harness.study.prediction.bench import backend_collectives, results_path
from harness.study.prediction.predict import (
    UNBENCHED,
    Workload,
    backend_traffic,
    network_from_benches,
    predict_scaling,
    prediction_table,
    unbenched,
    unbenched_lines,
)

SIZES = [4096 * 4**k for k in range(5)]


def _bench(collective: str) -> dict:
    """What `harness bench allreduce --collective COLLECTIVE -n 2 --results` writes (2 ranks, 1 node)."""
    steps = 2 if collective == "all_reduce" else 1
    return {
        "kind": "allreduce-benchmark",
        "backend": "ddp",
        "collective": collective,
        "world_size": 2,
        "nodes": 1,
        "ranks_per_node": 2,
        "hostname": "node1",
        "fit": {"alpha_s": 2e-5, "busbw_bytes_per_s": 1e9},
        "sizes": [{"bytes": size, "seconds": steps * (2e-5 + size / 2e9)} for size in SIZES],
    }


def _fsdp() -> Workload:
    calls = backend_traffic("fsdp", {}, ModelShape(4_000_000, unit_bytes=(2_000_000, 2_000_000)))
    return Workload(0.05, 0.03, 0.0, 4_000_000, 25 * 2**20, 1.0, 64, "by hand", calls=calls)


def test_collectives_no_benchmark_timed_are_named_with_the_command_and_their_steps_marked():
    network = network_from_benches([_bench("all_reduce")], ranks_per_node=1)
    assert unbenched(_fsdp(), network) == ["all_gather", "reduce_scatter"]
    lines = unbenched_lines(_fsdp(), network)
    assert len(lines) == 2 and all(line.startswith("warning: ") for line in lines)
    assert (
        "`harness bench allreduce --backend ddp -n 2 --collective all_gather --results bench-all_gather.json`"
        in (lines[0])
    )
    rows = predict_scaling(_fsdp(), network, [1, 2])
    table = [line for line in prediction_table(rows).splitlines() if line.startswith("|")][2:]
    assert UNBENCHED not in table[0] and UNBENCHED in table[1]  # one rank sends nothing: nothing priced
    # Every collective of the traffic timed: nothing to say, nothing marked.
    timed = network_from_benches([_bench(kind) for kind in ("all_reduce", "all_gather", "reduce_scatter")], 1)
    assert unbenched_lines(_fsdp(), timed) == [] and UNBENCHED not in prediction_table(predict_scaling(_fsdp(), timed))


def test_predict_prints_the_warning_on_a_line_of_its_own(tmp_path, capsys):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_bench("all_reduce")))
    flags = ["predict", "--network", str(path), "--throughput", "2470", "--batch-size", "256", "--model", "cnn"]
    assert main([*flags, "--backend", "fsdp", "--nodes", "1,2", "--ranks-per-node", "1"]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning: ")]
    assert [line.split()[1] for line in warnings] == ["all_gather", "reduce_scatter"]


def test_bench_times_every_collective_a_backend_issues():
    assert backend_collectives("ddp") == ("all_reduce",)
    assert backend_collectives("fsdp") == ("all_gather", "reduce_scatter")
    assert backend_collectives("deepspeed", {"zero_stage": 3}) == ("all_gather", "reduce_scatter")
    assert backend_collectives("none") == ("all_reduce",)  # one process: still a communicator to time
    assert results_path("out/bench.json", "all_gather", several=True) == "out/bench-all_gather.json"
    assert results_path("out/bench.json", "all_reduce", several=False) == "out/bench.json"
