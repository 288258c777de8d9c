"""`harness bench allreduce --collective`: all-gather and reduce-scatter timed on two local ranks
of every backend whose process group runs them, with nccl-tests' busbw and the ring fit of their
own (n-1) steps."""

from __future__ import annotations

import json

import pytest

from harness.backends import BACKENDS
from harness.backends.torch_distributed import TorchDistributedBackend
from harness.study.prediction.allreduce import fit_alpha_beta
from tests.conftest import harness

PROCESS_GROUP = sorted(name for name, cls in BACKENDS.items() if issubclass(cls, TorchDistributedBackend))


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_the_fit_of_a_half_ring_recovers_its_figures(collective):
    sizes = [4096 * 4**k for k in range(6)]
    seconds = [3 * 20e-6 + 3 / 4 * size / 5e9 for size in sizes]  # 4 ranks: 3 steps, 3/4 of the bytes
    fit = fit_alpha_beta(sizes, seconds, 4, collective)
    assert fit["alpha_s"] == pytest.approx(20e-6) and fit["busbw_bytes_per_s"] == pytest.approx(5e9)
    assert fit["steps"] == 3 and fit["collective"] == collective


@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_bench_times_the_sharded_collectives_on_two_ranks(tmp_path, collective):
    out = tmp_path / "bench.json"
    result = harness(
        "bench",
        "allreduce",
        "-n",
        "2",
        "--backend",
        PROCESS_GROUP[0],
        "--collective",
        collective,
        "--sizes",
        "4K,256K,4M",
        "--seconds-per-size",
        "0.05",
        "--results",
        str(out),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    bench = json.loads(out.read_text())
    assert bench["collective"] == collective and [line["bytes"] for line in bench["sizes"]] == [4096, 262144, 4194304]
    for line in bench["sizes"]:  # a ring's (n-1)/n of the whole buffer: half of it on two ranks
        assert line["busbw_bytes_per_s"] == pytest.approx(line["algbw_bytes_per_s"] / 2)
    assert result.stdout.startswith(collective) or f"\n{collective}, " in result.stdout
