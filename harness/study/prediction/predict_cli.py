"""`harness predict`'s flags and command: bad input refused before anything is written; the
network and workload the flags name; the prediction printed with its assumptions and, where the
compute comes from one GPU, the published anchors beside it."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any, Optional

from ...backends.memory import Training
from ...backends.traffic import ModelShape, per_step
from ...config import DEFAULT_TASK
from ...errors import UsageError
from ...fileio import atomic_write_json
from ...training.flags import add_train_flags, task_options_given
from .predict import (
    BACKWARD_SHARE,
    DEFAULT_NODES,
    Network,
    Workload,
    backend_traffic,
    measured_steps,
    network_from_benches,
    network_from_site,
    predict_scaling,
    prediction_table,
    scaled_to_measured,
    unbenched_lines,
    workload_from_records,
)
from .shapes import record_shape, task_shape

ANCHORS = os.path.join(os.path.dirname(__file__), "anchors.json")


def published_anchors() -> list[dict[str, Any]]:
    """Published scaling figures (NVIDIA DGX A100 ResNet-50, Horovod, torchtitan) with their sources."""
    with open(ANCHORS) as handle:
        return json.load(handle)


def add_predict_flags(parser: Any) -> None:
    """`harness predict`'s flags."""
    parser.add_argument(
        "--site",
        default=None,
        help="site profile for the network and GPUs per node: polaris, perlmutter (or a profile JSON)",
    )
    parser.add_argument(
        "--network",
        nargs="+",
        default=None,
        help="network figures fitted by `harness bench allreduce --results FILE` (across nodes: the network's); "
        "one file per --collective measured",
    )
    parser.add_argument(
        "--record",
        nargs="+",
        default=None,
        help="results file(s): compute per step from the runs at the fewest workers",
    )
    parser.add_argument("--throughput", type=float, default=None, help="or: published samples/s of one GPU")
    parser.add_argument("--batch-size", type=int, default=None, help="with --throughput: samples per GPU per step")
    parser.add_argument(
        "--backend",
        default=None,
        help="whose traffic to price: ddp, horovod, deepspeed, fsdp (default: the record's, else ddp's buckets)",
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a backend option by field name, e.g. zero_stage=3, keep_gathered=true, bucket_cap_mb=50",
    )
    parser.add_argument(
        "--gradient-bytes",
        type=int,
        default=None,
        help="bytes averaged per step (default: the record's, or --model's)",
    )
    parser.add_argument(
        "--bucket-mb",
        type=float,
        default=None,
        help="gradient bucket in MiB (default: the record's bucket_cap_mb / fusion_threshold_mb, else 25)",
    )
    parser.add_argument(
        "--overlap",
        type=float,
        default=1.0,
        help="without --backend: 0 (allreduce after backward) or 1 (buckets as ready); default 1",
    )
    parser.add_argument("--ranks-per-node", type=int, default=None, help="default: the site's GPUs per node")
    parser.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)), help="node counts (default: 1..512)")
    parser.add_argument(
        "--measured",
        nargs="+",
        default=None,
        help="results file(s) of runs to put beside the prediction (matched by world size)",
    )
    parser.add_argument("--json", default=None, help="write the prediction (and measured steps) as JSON here")
    parser.add_argument("-o", "--output", default=None, help="figure prefix: PREFIX-prediction.{png,svg,json}")
    # The task whose model's traffic is priced (default: the records'): --task SPEC --task-arg KEY=VALUE,
    # or the images task's flags (--model resnet50); its model is built here as a run builds it.
    add_train_flags(parser, only=("task", "task_args"))
    # What a rank holds (the memory table): without --record, the precision and optimizer these name.
    add_train_flags(parser, only=("precision", "optimizer", "momentum"))


def parse_nodes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; UsageError for anything but positive whole node counts."""
    try:
        nodes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        nodes = []
    if not nodes or min(nodes) < 1:
        raise UsageError(f"--nodes takes positive node counts, e.g. --nodes 1,2,4; got {text!r}")
    return nodes


def predict_command(args: Any) -> int:
    """`harness predict`: print the prediction table (and write JSON and figure when asked)."""
    nodes = parse_nodes(args.nodes)
    network, workload = network_and_workload(args)
    rows = predict_scaling(workload, network, nodes)
    measured = None
    if args.measured:
        from ...training.record import read_results

        measured = measured_steps(read_results(args.measured))
    print("\n".join(describe(network, workload) + unbenched_lines(workload, network)) + "\n")
    print(prediction_table(rows, measured))
    memory_text, memory = predicted_memory(args, network.ranks_per_node, nodes, workload.local_batch)
    print("\n" + "\n".join(memory_text))
    if workload.node_step_s is None and network.ranks_per_node > 1:
        print("\n" + "\n".join(anchor_lines()))
    document = {
        "network": asdict(network),
        "workload": asdict(workload),
        "predicted": rows,
        "measured": {str(k): v for k, v in (measured or {}).items()},
        "memory": memory,
    }
    if args.json:
        atomic_write_json(args.json, document)
    if args.output:
        from ..scaling.run_plots import write_prediction_figure

        for path in write_prediction_figure(rows, measured, f"{network.name}: {workload.source}", args.output):
            print(path)
    return 0


POSITIVE_FLAGS = ("throughput", "batch_size", "gradient_bytes", "bucket_mb", "ranks_per_node")


def check_positive(args: Any) -> None:
    """UsageError for a count or rate given as zero or less (a negative throughput has no prediction)."""
    for name in POSITIVE_FLAGS:
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be positive, got {value:g}; give {flag} a number above zero")


def read_bench(path: str) -> dict[str, Any]:
    """The result file of `harness bench allreduce --results`; UsageError naming the fix when it is
    missing, not JSON, or another kind of file (a results.jsonl of runs, a profile)."""
    fix = "give --network the JSON that `harness bench allreduce --results FILE` wrote"
    try:
        with open(path) as handle:
            result = json.load(handle)
    except FileNotFoundError:
        raise UsageError(f"--network file {path} does not exist; {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError, IsADirectoryError):
        raise UsageError(f"--network file {path} is not one JSON document; {fix}") from None
    if not isinstance(result, dict) or result.get("kind") != "allreduce-benchmark":
        raise UsageError(f"--network file {path} is not a benchmark result; {fix}")
    return result


def network_and_workload(args: Any) -> tuple[Network, Workload]:
    """The network (site profile and/or benchmark fit) and workload (records or a published
    throughput) that `harness predict`'s flags name; UsageError naming what is missing."""
    if not args.site and not args.network:
        raise UsageError(
            "name the network: --site polaris (its profile) or --network BENCH.json "
            "(`harness bench allreduce --results`)"
        )
    check_positive(args)
    network = network_from_site(args.site) if args.site else None
    if args.network:
        benches = [read_bench(path) for path in args.network]
        network = network_from_benches(benches, args.ranks_per_node, within=network)
    assert network is not None
    if args.ranks_per_node:
        network = replace(network, ranks_per_node=args.ranks_per_node)
    if args.overlap not in (0, 1):
        raise UsageError(f"--overlap is 0 (after backward) or 1 (as buckets are ready), got {args.overlap:g}")
    bucket = int(args.bucket_mb * 2**20) if args.bucket_mb else None
    shape = flag_task_shape(args)
    backend, options = args.backend, backend_options(args.backend_option)
    gradient = args.gradient_bytes or (shape.parameter_bytes if shape else None)
    if args.record:
        from ...training.record import read_results

        records = read_results(args.record)
        workload = workload_from_records(records, args.overlap, args.bucket_mb, gradient_bytes=gradient)
        return network, with_node_and_traffic(workload, records, network.ranks_per_node, backend, options, shape)
    if not (args.throughput and args.batch_size and gradient):
        raise UsageError(
            "give the compute: --record RESULTS.jsonl, or --throughput SAMPLES_PER_S --batch-size N "
            "with the task (--task SPEC, or --model NAME for the images task) or --gradient-bytes N"
        )
    compute = args.batch_size / args.throughput
    workload = Workload(
        compute_s=compute,
        backward_s=BACKWARD_SHARE * compute,
        overhead_s=0.0,
        gradient_bytes=gradient,
        bucket_bytes=bucket or 25 * 2**20,
        overlap=args.overlap,
        local_batch=args.batch_size,
        source=f"{args.throughput:g} samples/s per GPU at batch {args.batch_size}"
        + (f", {task_label(args)}" if shape else ""),
    )
    return network, with_node_and_traffic(workload, [], network.ranks_per_node, backend, options, shape)


def predicted_memory(
    args: Any, ranks_per_node: int, nodes: Sequence[int], local_batch: int
) -> tuple[list[str], list[dict[str, Any]]]:
    """The memory per rank of the task the flags name (else the records'), trained as the records
    were (else as --precision, --optimizer and --momentum say), per backend (harness.study.prediction.memory):
    the lines printed and the rows --json writes (none where it cannot be predicted)."""
    from .memory import memory_report

    records = given_records(args)
    named = memory_task(args, records)
    if named is None:
        return ["memory per rank: name the task (--task SPEC, or --model NAME for the images task) to predict it"], []
    task, task_args = named
    training = flag_training(args, records, local_batch)
    options = backend_options(args.backend_option) if args.backend else {}
    try:
        return memory_report(task, task_args, training, args.backend, options, nodes, ranks_per_node, args.site)
    except UsageError as exc:  # the step-time prediction stands without it
        return [f"memory per rank: not predicted ({exc})"], []


def memory_task(args: Any, records: Sequence[dict[str, Any]]) -> Optional[tuple[str, dict[str, Any]]]:
    """(task, its arguments) whose memory is predicted: the one the flags name (the images task
    ImageNet-shaped, as for the traffic), else that of `records` (the --record files'); None where
    neither names one."""
    task_args = _task_args(args)
    task, given = args.task, args.task != DEFAULT_TASK or bool(task_args)
    recorded = (records[0].get("task") or {}) if records else {}
    if given and task == DEFAULT_TASK:  # ImageNet-shaped for the ResNets, as for the traffic
        return task, {"dataset": "synthetic", **task_args}
    if not given and recorded.get("spec"):
        return recorded["spec"], recorded.get("args") or {}
    return (task, task_args) if given else None


def flag_training(args: Any, records: Sequence[dict[str, Any]], local_batch: int) -> Training:
    """What a rank trains with: as `records` were (else as --precision, --optimizer and --momentum
    say, on GPUs, which a site's prediction is for), a micro-batch of `local_batch` over the records'
    gradient accumulation."""
    config = records[0].get("config", {}) if records else vars(args)
    return Training(
        precision=config.get("precision", "fp32"),
        optimizer=config.get("optimizer", "sgd"),
        momentum=config.get("momentum", 0.9),
        micro_batch=local_batch // config.get("grad_accum", 1),
        eval_batch=config.get("eval_batch_size", 0),
        device=records[0].get("device", "cuda") if records else "cuda",
    )


def given_records(args: Any) -> list[dict[str, Any]]:
    """The records of the --record files (none without the flag)."""
    from ...training.record import read_results

    return read_results(args.record) if args.record else []


def _task_args(args: Any) -> dict[str, Any]:
    """The task's arguments the flags give: --task-arg, and a built-in task's own flags (--model ...)."""
    return {**(args.task_args or {}), **task_options_given(args, args.task)}


def task_label(args: Any) -> str:
    """The task the flags name, e.g. 'images model=resnet50' or 'model.py:make_task width=64'."""
    return " ".join([args.task, *(f"{key}={value}" for key, value in sorted(_task_args(args).items()))])


def flag_task_shape(args: Any) -> Optional[ModelShape]:
    """The shape of the task the flags name (its model built here), or None where they name none
    (then the records' own is priced). The images task's --dataset defaults to synthetic here: the
    input published throughputs are for (ImageNet-shaped for the ResNets)."""
    task_args = _task_args(args)
    if args.task == DEFAULT_TASK and not task_args:
        return None
    if args.task == DEFAULT_TASK:
        task_args = {"dataset": "synthetic", **task_args}
    return task_shape(args.task, task_args)


def backend_options(pairs: Sequence[str]) -> dict[str, Any]:
    """--backend-option NAME=VALUE pairs by name, each value as JSON where it is JSON, else the text."""
    options = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--backend-option takes NAME=VALUE, e.g. zero_stage=3; got {pair!r}")
        options[name.strip()] = json.loads(value) if value.strip() not in ("",) and _is_json(value) else value
    return options


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def with_node_and_traffic(
    workload: Workload,
    records: Sequence[dict[str, Any]],
    ranks_per_node: int,
    backend: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
    shape: Optional[ModelShape] = None,
) -> Workload:
    """The workload with its backend's own collectives (`backend` with `options`, else the
    records' own; bytes per kind as measured where the record has them) on the model of `shape`
    (else the records' task's; one unit of the gradient bytes where neither has as many bytes)
    and, where its runs filled one node, that node's measured step."""
    baseline = [r for r in records if r.get("world_size") == min(x["world_size"] for x in records)] if records else []
    first = baseline[0] if baseline else {}
    if not backend:
        backend, options = first.get("backend"), first.get("config", {}).get("backend_options", {})
    if not backend:
        return workload
    options = options or {}
    shape = shape or record_shape(first)
    if shape is None or shape.parameter_bytes != workload.gradient_bytes:  # --gradient-bytes over the model's
        shape = ModelShape(workload.gradient_bytes)
    calls = backend_traffic(backend, options, shape, on_gpu=first.get("device", "cuda") != "cpu")
    # Measured bytes stand for the traffic only where ranks had peers: alone, a backend sends little
    # or nothing (DDP and FSDP skip their reductions at one rank), which is not what N ranks send.
    measured = first.get("step_breakdown", {}).get("collectives") if first.get("world_size", 1) > 1 else None
    source = f"{backend} {options or 'defaults'}: modelled from its options"
    if measured:
        calls, source = scaled_to_measured(calls, measured), f"{backend}: bytes per kind as the record measured"
    node_step = None
    if ranks_per_node > 1 and first.get("world_size") == ranks_per_node == first.get("local_world_size"):
        node_step = measured_steps(baseline)[ranks_per_node]["mean"]
    return replace(workload, calls=calls, traffic_source=source, node_step_s=node_step)


def describe(network: Any, workload: Workload) -> list[str]:
    """The lines printed before the table: inputs, traffic per step, and every assumption."""
    assumptions = prediction_assumptions(network, workload)
    return [*input_lines(network, workload), traffic_line(workload), "assumptions:"] + [
        f"  - {line}" for line in assumptions
    ]


def input_lines(network: Any, workload: Workload) -> list[str]:
    """The network and the compute a prediction starts from, one line each."""
    return [
        f"network: {network.source}",
        f"compute: {workload.source}: {workload.compute_s * 1e3:.2f} ms per step "
        f"(+ {workload.overhead_s * 1e3:.2f} ms overhead)",
    ]


def traffic_line(workload: Workload) -> str:
    """The workload's collectives per step: each kind's calls and bytes, and where they come from."""
    traffic = per_step(workload.collectives())
    return f"traffic per step ({workload.traffic_source}): " + "; ".join(
        f"{kind} x{t['count']}, {t['bytes'] / 2**20:.1f} MiB" for kind, t in traffic.items()
    )


def prediction_assumptions(network: Any, workload: Workload) -> list[str]:
    """What the step-time prediction takes for granted: the network's pricing and the compute's."""
    assumptions = network.assumptions()
    if workload.node_step_s is not None:
        assumptions.append(
            f"one full node measured: {workload.node_step_s * 1e3:.2f} ms per step; only the traffic across "
            "nodes is modelled on top of it"
        )
    elif network.ranks_per_node > 1:
        assumptions.append(
            "compute from one GPU: per-node efficiency assumed 1.0 (no host, input or node contention); "
            "see the published anchors below"
        )
    assumptions.append(f"backward is {BACKWARD_SHARE:.2f} of forward + backward; buckets ready evenly over it")
    return assumptions


def anchor_lines() -> list[str]:
    """The published anchors, one line each with its source."""
    found = []
    for anchor in published_anchors():
        figures = [f"{anchor['samples_per_s']:,} samples/s" if "samples_per_s" in anchor else ""]
        figures += [f"efficiency {anchor['efficiency']:.3f}" if "efficiency" in anchor else ""]
        found.append(f"  {anchor['name']}: {', '.join(f for f in figures if f)} ({anchor['source']})")
    return ["published anchors:", *found]
