"""Every study predicts before it runs, and its report says by how much the prediction missed.

Before the first run, `write_prediction` puts JOB_DIR/prediction.json beside the study: for each
planned backend and node count, the traffic per step the backend declares for the runs' task (its
model built here as a run builds it, harness.study.prediction.shapes), what each collective costs on the
site's network (NCCL's algorithm and protocol where the profile has an `nccl` section) and, where
a published figure gives the compute of one GPU (harness/study/prediction/anchors.json: the images task's
ResNet-50), the step time and efficiency. What is fixed then is the communication model; the compute is the node's:
after the runs, `prediction_rows` takes each backend's runs at the fewest nodes as the node
measured first (harness.study.prediction.predict_cli.with_node_and_traffic) and sets the saved network's
prediction for every node count beside the measured step, with the error. Beside the step, each
row sets the memory per rank that the runs predicted at their start (their record's
memory.predicted, harness.backends.memory) against what they measured, with its error
(`memory_beside`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Optional

from ...config import DEFAULT_TASK, TrainConfig
from ...fileio import atomic_write_json
from ...tasks.images import ImageOptions
from ...training.flags import parse_train_flags
from .predict import interval_ms, measured_steps, network_from_site, predict_scaling, workload_from_records
from .shapes import task_shape

PREDICTION_FILE = "prediction.json"


def _published_compute(config: TrainConfig) -> Optional[dict[str, Any]]:
    """The published throughput of one GPU for the built-in images task's model, if there is one."""
    from .predict_cli import published_anchors

    if config.task != DEFAULT_TASK:
        return None
    model = config.task_args.get("model", ImageOptions().model)
    for anchor in published_anchors():
        if anchor.get("model") == model and anchor.get("gpus") == 1 and anchor.get("samples_per_s"):
            return anchor
    return None


def plan_prediction(
    site: str, backends: Sequence[str], nodes: Sequence[int], train_args: Sequence[str]
) -> dict[str, Any]:
    """The prediction document for a study's plan (the runs' `harness train` flags: their task, its
    model built here, and each backend's options); {"skipped": why} where the site has no network figures."""
    from ...errors import UsageError
    from .predict import Workload
    from .predict_cli import with_node_and_traffic

    try:
        network = network_from_site(site)
    except UsageError as exc:
        return {"skipped": str(exc)}
    configs = {backend: parse_train_flags(["--backend", backend, *train_args]) for backend in backends}
    config = next(iter(configs.values()))
    shape = task_shape(config.task, config.task_args)
    batch = config.batch_size
    anchor = _published_compute(config)
    compute = batch / anchor["samples_per_s"] if anchor else 1e-9  # 1 ns: communication alone
    document: dict[str, Any] = {
        "site": site,
        "task": {"spec": config.task, "args": config.task_args, "parameter_bytes": shape.parameter_bytes},
        "batch_size": batch,
        "network": asdict(network),
        "compute": anchor or "none published for this task: only the communication is predicted before the runs",
        "backends": {},
    }
    for backend, backend_config in configs.items():
        planned = Workload(compute, 2 / 3 * compute, 0.0, shape.parameter_bytes, 25 * 2**20, 1.0, batch, "plan")
        workload = with_node_and_traffic(
            planned, [], network.ranks_per_node, backend, backend_config.backend_options, shape
        )
        rows = predict_scaling(workload, network, list(nodes))
        document["backends"][backend] = {
            "traffic": [asdict(call) for call in workload.collectives()],
            "rows": rows
            if anchor
            else [{k: row[k] for k in ("nodes", "ranks", "allreduce_s", "algorithms")} for row in rows],
        }
    return document


def write_prediction(
    directory: str, site: str, backends: Sequence[str], nodes: Sequence[int], train_args: Sequence[str]
) -> str:
    """Write DIRECTORY/prediction.json for the plan (atomically); returns its path."""
    document = plan_prediction(site, backends, sorted(set(nodes)), train_args)
    path = os.path.join(directory, PREDICTION_FILE)
    atomic_write_json(path, document, default=str)
    return path


def prediction_rows(directory: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backend and node count: predicted step (node measured first, the saved site network)
    and measured step with its interval and the error; [] where no prediction was written."""
    from .predict_cli import with_node_and_traffic

    path = os.path.join(directory, PREDICTION_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        saved = json.load(handle)
    if "skipped" in saved:
        return []
    network = network_from_site(saved["site"])
    rows = []
    for backend in saved["backends"]:
        runs = [r for r in records if r.get("backend") == backend and r.get("step_breakdown", {}).get("timed_steps")]
        if not runs:
            continue
        fewest = min(r["world_size"] for r in runs)
        node = [r for r in runs if r["world_size"] == fewest]
        workload = with_node_and_traffic(
            workload_from_records(node, 1.0, None), node, network.ranks_per_node, backend, None
        )
        measured = measured_steps(runs)
        planned = sorted({max(1, r["world_size"] // network.ranks_per_node) for r in runs})
        for row in predict_scaling(workload, network, planned):
            found = measured.get(row["ranks"])
            rows.append(
                {
                    **memory_beside([r for r in runs if r["world_size"] == row["ranks"]]),
                    "backend": backend,
                    "nodes": row["nodes"],
                    "ranks": row["ranks"],
                    "predicted_step_s": row["step_s"],
                    "measured_step_s": found["mean"] if found else None,
                    "measured_interval_s": found["interval"] if found else None,
                    "error": row["step_s"] / found["mean"] - 1 if found and found["mean"] else None,
                    "algorithms": row["algorithms"],
                }
            )
    return rows


def prediction_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The predicted-vs-measured table of a study's report."""
    from ..scaling.report import markdown_table

    return markdown_table(
        list(rows),
        [
            ("backend", lambda r: r["backend"]),
            ("nodes", lambda r: r["nodes"]),
            ("predicted step ms", lambda r: 1e3 * r["predicted_step_s"]),
            ("measured step ms", lambda r: 1e3 * r["measured_step_s"] if r["measured_step_s"] else None),
            ("95% interval", lambda r: interval_ms(r["measured_interval_s"]) if r["measured_step_s"] else None),
            ("error", lambda r: f"{r['error']:+.1%}" if r["error"] is not None else None),
            ("algorithm", lambda r: r["algorithms"] or "-"),
            ("memory compared", lambda r: r["memory_compared"] or "-"),
            ("predicted GiB", lambda r: _gib(r["predicted_memory_bytes"])),
            ("measured GiB", lambda r: _gib(r["measured_memory_bytes"])),
            ("memory error", lambda r: f"{r['memory_error']:+.1%}" if r["memory_error"] is not None else None),
        ],
    )


def _gib(value: Optional[float]) -> Optional[float]:
    return value / 2**30 if value is not None else None


def memory_beside(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The predicted and measured memory per rank of `runs` (one backend, one world size), the largest
    rank's, mean over runs, and the error (predicted / measured - 1). On a GPU the allocator's peak
    against the predicted total; on the CPU, whose resident set also holds torch itself (which the
    prediction leaves out), the counted model state against the predicted one. None where no run
    holds a prediction (a backend without a memory rule, a record from before there were any)."""
    from ...training.memory import RSS_PEAK

    pairs, compared = [], None
    for run in runs:
        memory = run.get("memory") or {}
        predicted = memory.get("predicted")
        if not predicted:
            continue
        if memory.get("source") == RSS_PEAK:
            counted = (memory.get("model_state_bytes_per_rank") or {}).get("total")
            if counted:
                pairs.append((predicted["model_state_bytes"], max(counted)))
                compared = "model state"
        else:
            pairs.append((predicted["total_bytes"], max(memory["peak_bytes_per_rank"])))
            compared = "peak"
    if not pairs:
        return dict.fromkeys(("memory_compared", "predicted_memory_bytes", "measured_memory_bytes", "memory_error"))
    predicted, measured = (sum(column) / len(pairs) for column in zip(*pairs))
    return {
        "memory_compared": compared,
        "predicted_memory_bytes": predicted,
        "measured_memory_bytes": measured,
        "memory_error": predicted / measured - 1 if measured else None,
    }
