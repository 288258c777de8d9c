"""`harness predict` checked against measured runs across the nodes of a namespace cluster whose
links are shaped with tc (tests/multinode/netns_cluster.py: needs root and network namespaces).

For each link setting (rate, added one-way latency): `harness bench allreduce` across 2 and 3
nodes (one rank per node), then DDP training of the workshop CNN (batch 32 per rank, 1 thread,
synthetic data) on 1, 2 and 3 nodes, repeats interleaved. The prediction combines the compute
per step of the 1-node runs with (a) the link's own figures (busbw = rate / 8, alpha = latency)
and (b) the 2-node benchmark's fit, and is compared with the measured step time at 2 and 3 nodes.
Every node is a namespace on this one machine: the ranks share its cores (the records' contention
sections say how much). Usage (as root):
    .venv/bin/python benchmarks/prediction.py [--repeats 2] [--steps 30] [--out runs/prediction]
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
from harness.study.predict import Network, measured_steps, network_from_bench, predict_scaling, workload_from_records  # noqa: E402
from harness.training.record import read_records  # noqa: E402
from tests.multinode.netns_cluster import NetnsCluster  # noqa: E402

# (Mbit/s, added one-way ms); a latency needs the kernel's netem (ShapingUnavailable without it).
SETTINGS: Sequence[tuple[float, float]] = ((100.0, 0.0), (400.0, 0.0), (1000.0, 0.0))
PORT = 29611
TRAIN = [
    "--backend",
    "ddp",
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
]
BENCH_SIZES = "64K,256K,1M,4M,16M"


def _torchrun(nodes: int, node: int, program: list[str]) -> list[str]:
    return [
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


def _link_network(rate_mbit: float, latency_ms: float) -> Network:
    """The link's own figures: tbf's rate (bytes/s) as the ring's busbw, netem's delay as alpha."""
    return Network(
        f"{rate_mbit:g} Mbit/s, {latency_ms:g} ms",
        ranks_per_node=1,
        alpha_intra_s=0.0,
        alpha_inter_s=latency_ms * 1e-3,
        base_latency_s=0.0,
        busbw_intra=rate_mbit * 1e6 / 8,
        busbw_inter=rate_mbit * 1e6 / 8,
        source="tc settings",
    )


def _done(results: str) -> set:
    """(setting, world size, repeat) of the runs OUT already holds: an interrupted measurement resumes."""
    if not os.path.exists(results):
        return set()
    return {(r["tags"]["setting"], r["world_size"], r["tags"]["repeat"]) for r in read_records([results])}


def measure(out: str, repeats: int, steps: int) -> None:
    """Benchmarks and training runs for every setting, appended to OUT/runs.jsonl and OUT/bench-*.json."""
    results = os.path.join(out, "runs.jsonl")
    train = [*TRAIN, "--max-steps", str(steps), "--results", results]
    for repeat in range(repeats):
        done = _done(results)
        # One node: no link is crossed, so one set of runs serves every setting.
        if ("local", 1, str(repeat)) not in done:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "harness",
                    "train",
                    *train,
                    "--tag",
                    f"repeat={repeat}",
                    "--tag",
                    "setting=local",
                ],
                check=True,
                env=launch_environment(),
            )
        for rate, latency in SETTINGS:
            for nodes in (2, 3):
                bench = os.path.join(out, f"bench-{rate:g}-{latency:g}-{nodes}.json")
                if os.path.exists(bench) and (f"{rate:g}-{latency:g}", nodes, str(repeat)) in done:
                    continue
                with NetnsCluster(nodes, tempfile.mkdtemp(prefix="prediction-")) as cluster:
                    cluster.shape(latency_ms=latency, rate_mbit=rate)
                    if not os.path.exists(bench):
                        _across(
                            cluster,
                            [
                                "bench",
                                "allreduce",
                                "--backend",
                                "ddp",
                                "--sizes",
                                BENCH_SIZES,
                                "--seconds-per-size",
                                "1",
                                "--results",
                                bench,
                            ],
                        )
                    if (f"{rate:g}-{latency:g}", nodes, str(repeat)) not in done:
                        _across(
                            cluster,
                            ["train", *train, "--tag", f"repeat={repeat}", "--tag", f"setting={rate:g}-{latency:g}"],
                        )


def _mean(records: list[dict[str, Any]], key: str) -> float:
    return sum(r["step_breakdown"]["seconds_per_step"][key] for r in records) / len(records)


def compare(out: str) -> dict[str, Any]:
    """Predicted vs measured per setting: step time (the goal: within 15%) and, to tell the model's
    errors apart, communication and compute. Printed as tables; returned as data."""
    records = read_records([os.path.join(out, "runs.jsonl")])
    local = [r for r in records if r["tags"]["setting"] == "local"]
    workload = workload_from_records(local, overlap=1.0, bucket_mb=None)
    document: dict[str, Any] = {"workload": workload.__dict__, "settings": {}}
    lines = [
        "| link | nodes | predicted step ms (link / fit) | measured step ms ± 95% | error (link / fit) | "
        "predicted communication ms (fit) | measured communication ms | measured compute ms (1 node: "
        f"{1e3 * workload.compute_s:.0f}) | error with the runs' own compute (fit) | contended runs |",
        "|" + "---|" * 10,
    ]
    for rate, latency in SETTINGS:
        name = f"{rate:g}-{latency:g}"
        runs = [r for r in records if r["tags"]["setting"] == name]
        if not runs:
            continue
        measured = measured_steps(runs)  # by world size = nodes (one rank per node)
        with open(os.path.join(out, f"bench-{name}-2.json")) as handle:
            fitted = network_from_bench(json.load(handle), ranks_per_node=1)
        link = predict_scaling(workload, _link_network(rate, latency), [1, 2, 3])
        fit = predict_scaling(workload, fitted, [1, 2, 3])
        document["settings"][name] = {
            "fit": fitted.__dict__,
            "predicted_link": link,
            "predicted_fit": fit,
            "measured": {str(k): v for k, v in measured.items()},
        }
        for nodes in (2, 3):
            mine = [r for r in runs if r["world_size"] == nodes]
            step = measured.get(nodes)
            if not step:
                continue
            by_link, by_fit = link[nodes - 1]["step_s"], fit[nodes - 1]["step_s"]
            # The network model alone: the runs' own compute (and overhead) plus the predicted exposed wait.
            own_compute = _mean(mine, "forward_backward") + _mean(mine, "optimizer")
            own_step = own_compute + _mean(mine, "data_wait") + _mean(mine, "other") + fit[nodes - 1]["exposed_s"]
            lines.append(
                f"| {rate:g} Mbit/s | {nodes} | {1e3 * by_link:.0f} / {1e3 * by_fit:.0f}"
                f" | {1e3 * step['mean']:.0f} ± {1e3 * (step['ci95'] or 0):.0f} | "
                f"{by_link / step['mean'] - 1:+.0%} / {by_fit / step['mean'] - 1:+.0%}"
                f" | {1e3 * fit[nodes - 1]['exposed_s']:.0f} | {1e3 * _mean(mine, 'communication'):.0f} | "
                f"{1e3 * own_compute:.0f} | {own_step / step['mean'] - 1:+.0%} | "
                f"{sum(r['contention']['flagged'] for r in mine)} of {len(mine)} |"
            )
        print(f"\n{rate:g} Mbit/s: fit across 2 nodes {fitted.source}")
    print("\n" + "\n".join(lines))
    document["table"] = lines
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="steps per run (5 of them warm-up)")
    parser.add_argument("--out", default="runs/prediction", help="directory for records, benchmarks and the summary")
    parser.add_argument("--compare-only", action="store_true", help="compare what OUT holds, measure nothing")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if not args.compare_only:
        measure(args.out, args.repeats, args.steps)
    with open(os.path.join(args.out, "summary.json"), "w") as handle:
        json.dump(compare(args.out), handle, indent=1)


if __name__ == "__main__":
    main()
