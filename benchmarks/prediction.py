"""`harness predict` held out from its fit: predictions of the 2-node step of DDP, FSDP and ZeRO-3
from a 1-node run of each and a 2-node `harness bench` of each collective, against measured 2-node
runs, on a namespace cluster whose link is shaped with tc (tests/multinode/netns_cluster.py: needs
root and network namespaces).

For each link rate: `harness bench allreduce --collective all_reduce|all_gather|reduce_scatter`
across 2 nodes (one rank per node), then each backend's training of the workshop CNN (batch 32 per
rank, 1 thread, synthetic data) on 2 nodes; the 1-node runs cross no link and serve every rate.
Repeats interleave the backends. Each node's rank is pinned to a core of its own (taskset: node k on
core k-1), the 1-node run to core 0; the machine's other load shares those cores, and each record's
contention section says how much (the table counts the contended runs). What 2 cores cannot show:
more ranks per node than one, intra-node links, a third node without sharing a core.
Usage (as root):
    .venv/bin/python benchmarks/prediction.py [--repeats 2] [--steps 25] [--rates 50,300,2000] [--out runs/prediction]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness.process.launchers import launch_environment  # noqa: E402
from harness.study.prediction.predict import (  # noqa: E402
    interval_ms,
    measured_steps,
    network_from_benches,
    predict_scaling,
    workload_from_records,
)
from harness.study.prediction.predict_cli import with_node_and_traffic  # noqa: E402
from harness.training.record import read_records  # noqa: E402
from tests.multinode.netns_cluster import NetnsCluster  # noqa: E402

RATES_MBIT: Sequence[float] = (50.0, 300.0, 2000.0)
# (label, `harness train` flags): the backends and option sets whose traffic differs.
BACKENDS: Sequence[tuple[str, list[str]]] = (
    ("ddp", ["--backend", "ddp"]),
    ("fsdp", ["--backend", "fsdp"]),
    ("zero3", ["--backend", "deepspeed", "--zero-stage", "3"]),
)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
PORT = 29611
TRAIN = [
    "--model",
    "cnn",
    "--dataset",
    "synthetic",
    "--batch-size",
    "32",
    "--timing-warmup-steps",
    "5",
    "--threads",
    "1",
    "--eval-every",
    "0",
    "--eval-batch-size",  # the last evaluation in one forward a rank: FSDP and ZeRO-3 gather weights for each
    "1000",
]
BENCH_SIZES = "16K,64K,256K,1M,4M,8M"  # around every call of the CNN (the largest: 4.8 MB)


def _torchrun(nodes: int, node: int, program: list[str]) -> list[str]:
    return [
        "taskset",
        "-c",
        str(node - 1),  # each node's rank on a core of its own
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--node-rank",
        str(node - 1),
        "--nproc-per-node",
        "1",
        "--master-addr",
        "node1",
        "--master-port",
        str(PORT),
        "-m",
        "harness",
        *program,
    ]


def _across(cluster: NetnsCluster, program: list[str], timeout: float = 900) -> None:
    """Run `harness PROGRAM` as one rank on every node of the cluster, to its end."""
    nodes = len(cluster.hostnames)
    processes = [
        cluster.popen(
            node,
            _torchrun(nodes, node, program),
            env=launch_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(1, nodes + 1)
    ]
    outputs = [process.communicate(timeout=timeout)[0] for process in processes]
    if any(process.returncode for process in processes):
        raise SystemExit(f"{program[:2]} across {nodes} nodes failed:\n{outputs[0][-3000:]}")


def _done(results: str) -> set:
    """(setting, backend, repeat) of the runs OUT already holds: an interrupted measurement resumes."""
    if not os.path.exists(results):
        return set()
    return {(r["tags"]["setting"], r["tags"]["label"], r["tags"]["repeat"]) for r in read_records([results])}


def _bench(out: str, rate: float, collective: str) -> str:
    return os.path.join(out, f"bench-{rate:g}-{collective}.json")


def measure(
    out: str,
    repeats: int,
    steps: int,
    rates: Sequence[float] = RATES_MBIT,
    backends: Sequence[tuple[str, list[str]]] = BACKENDS,
    sizes: str = BENCH_SIZES,
) -> None:
    """Benchmarks (of `sizes`) and training runs for every rate, appended to OUT/runs.jsonl and
    OUT/bench-*.json."""
    results = os.path.join(out, "runs.jsonl")
    train = [*TRAIN, "--max-steps", str(steps), "--results", results]
    for repeat in range(repeats):
        for label, flags in backends:  # one node: no link is crossed, one set serves every rate
            tags = ["--tag", f"repeat={repeat}", "--tag", "setting=local", "--tag", f"label={label}"]
            if ("local", label, str(repeat)) not in _done(results):
                command = ["taskset", "-c", "0", sys.executable, "-m", "harness", "train", *train, *flags, *tags]
                subprocess.run(command, check=True, env=launch_environment(), timeout=900)
        for rate in rates:
            with NetnsCluster(2, tempfile.mkdtemp(prefix="prediction-")) as cluster:
                cluster.shape(rate_mbit=rate)
                for collective in COLLECTIVES:
                    if not os.path.exists(_bench(out, rate, collective)):
                        program = ["bench", "allreduce", "--backend", "ddp", "--collective", collective]
                        program += ["--sizes", sizes, "--seconds-per-size", "1"]
                        _across(cluster, [*program, "--results", _bench(out, rate, collective)])
                for label, flags in backends:
                    if (f"{rate:g}", label, str(repeat)) not in _done(results):
                        tags = ["--tag", f"repeat={repeat}", "--tag", f"setting={rate:g}", "--tag", f"label={label}"]
                        _across(cluster, ["train", *train, *flags, *tags])


def _mean(records: list[dict[str, Any]], key: str) -> float:
    return sum(r["step_breakdown"]["seconds_per_step"][key] for r in records) / len(records)


def _prediction(out: str, rate: float, local: list[dict[str, Any]]) -> dict[str, Any]:
    benches = []
    for collective in COLLECTIVES:
        with open(_bench(out, rate, collective)) as handle:
            benches.append(json.load(handle))
    network = network_from_benches(benches, ranks_per_node=1)
    workload = with_node_and_traffic(workload_from_records(local, overlap=1.0, bucket_mb=None), local, 1)
    return {"network": network, "workload": workload, "rows": predict_scaling(workload, network, [1, 2])}


def compare(
    out: str, rates: Sequence[float] = RATES_MBIT, backends: Sequence[tuple[str, list[str]]] = BACKENDS
) -> dict[str, Any]:
    """Predicted vs measured 2-node step per backend and rate (the goal: within 15%), with the
    communication each predicts and measures, to tell the model's errors apart. Printed; returned."""
    records = read_records([os.path.join(out, "runs.jsonl")])
    lines = [
        "| backend | link | predicted step ms | measured step ms [95% interval] | error | predicted exposed "
        "communication ms | measured communication ms | 1-node step ms | error with the 2-node runs' own "
        "compute | contended runs (2 nodes) |",
        "|" + "---|" * 10,
    ]
    document: dict[str, Any] = {"rows": []}
    for label, _ in backends:
        local = [r for r in records if r["tags"]["label"] == label and r["tags"]["setting"] == "local"]
        for rate in rates:
            runs = [r for r in records if r["tags"]["label"] == label and r["tags"]["setting"] == f"{rate:g}"]
            if not local or not runs or not os.path.exists(_bench(out, rate, COLLECTIVES[-1])):
                continue
            predicted = _prediction(out, rate, local)["rows"][1]
            step = measured_steps(runs)[2]
            error = predicted["step_s"] / step["mean"] - 1
            # The network model alone: the runs' own compute and overhead (slowed by the cores they
            # share with the machine's other load) plus the predicted exposed communication.
            own = sum(_mean(runs, key) for key in ("forward_backward", "optimizer", "data_wait", "other"))
            own_error = (own + predicted["exposed_s"]) / step["mean"] - 1
            document["rows"].append(
                {
                    "backend": label,
                    "rate_mbit": rate,
                    "predicted": predicted,
                    "measured": step,
                    "error": error,
                    "error_with_own_compute": own_error,
                }
            )
            lines.append(
                f"| {label} | {rate:g} Mbit/s | {1e3 * predicted['step_s']:.0f} | {1e3 * step['mean']:.0f} "
                f"{interval_ms(step['interval'])} | {error:+.1%} | {1e3 * predicted['exposed_s']:.0f} | "
                f"{1e3 * _mean(runs, 'communication'):.0f} | {1e3 * measured_steps(local)[1]['mean']:.0f} | "
                f"{own_error:+.1%} | "
                f"{sum(r['contention']['flagged'] for r in runs)} of {len(runs)} |"
            )
    print("\n".join(lines))
    document["table"] = lines
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=25, help="steps per run (5 of them warm-up)")
    parser.add_argument("--out", default="runs/prediction", help="directory for records, benchmarks and the summary")
    parser.add_argument("--rates", default=",".join(f"{rate:g}" for rate in RATES_MBIT), help="link rates, Mbit/s")
    parser.add_argument("--compare-only", action="store_true", help="compare what OUT holds, measure nothing")
    args = parser.parse_args()
    try:
        rates = [float(rate) for rate in args.rates.split(",")]
    except ValueError:
        parser.error(f"--rates takes rates in Mbit/s such as 50,300,2000; got {args.rates!r}")
    if not rates or min(rates) <= 0:
        parser.error(f"--rates takes positive rates in Mbit/s such as 50,300,2000; got {args.rates!r}")
    os.makedirs(args.out, exist_ok=True)
    if not args.compare_only:
        measure(args.out, args.repeats, args.steps, rates)
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(compare(args.out, rates), handle, indent=1, default=str)


if __name__ == "__main__":
    main()
