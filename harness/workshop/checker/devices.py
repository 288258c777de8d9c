"""Which device each rank picks, and a check's ranks launched as if on several nodes.

A script must pick its GPU by its local rank (its place on its node). By its global rank it works
on one node, where the two agree, and fails on a cluster's second node, whose GPUs are numbered
from 0 again. To show that mistake on one machine, `harness check --simulate-nodes N` has every
rank rewrite, before the script starts, the variables its launcher set per node as a launcher on
a node of its own would have set them (`simulate_nodes`): the local rank and local size
(LOCAL_RANK, LOCAL_WORLD_SIZE, HOROVOD_LOCAL_RANK ...), the node's number and the number of nodes
(GROUP_RANK, CROSS_RANK ...), and Horovod's host name, which scopes its per-node rendezvous. Global
rank, world size and the rendezvous address stay as they are. The ranks then run on the CPU
(CUDA_VISIBLE_DEVICES empty): one machine's GPUs cannot be dealt out as the nodes' own.

The device index a rank picks is seen two ways:
- where it runs (on GPUs): the index each torch.cuda.set_device call gets, and the device of the
  model's weights at the first step;
- what it would pick, on a CPU too, where the script's CUDA branch never runs: the index
  expressions of the script's CUDA device code (torch.device("cuda", i), f"cuda:{i}",
  torch.cuda.set_device(i), .cuda(i), device_ids=[i], os.environ["CUDA_VISIBLE_DEVICES"] = i),
  found in its source and evaluated in its globals once it has built its model (its process
  group is up then) and again when it ends (`DeviceExpressions`).
The judge flags a rank whose device index is its global rank but not its local rank.
"""

from __future__ import annotations

import ast
import numbers
import os
import re
from collections.abc import MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from ...process.discovery import LOCAL_RANK_VARIABLES, LOCAL_WORLD_SIZE_VARIABLES, ClusterEnv, detect_cluster
from .todos import Failure, Framework

if TYPE_CHECKING:
    from .observe import Observation

# The launchers' per-node variables beside the local rank and size that harness.process.discovery reads.
NODE_RANK_VARIABLES = (
    "GROUP_RANK",
    "NODE_RANK",
    "CROSS_RANK",
    "HOROVOD_CROSS_RANK",
    "OMPI_COMM_WORLD_NODE_RANK",
    "SLURM_NODEID",
)
NODE_COUNT_VARIABLES = ("GROUP_WORLD_SIZE", "CROSS_SIZE", "HOROVOD_CROSS_SIZE", "SLURM_NNODES")
HOST_VARIABLES = ("HOROVOD_HOSTNAME",)
Device = tuple[int, str]  # a device index the rank picked, and where


def simulate_nodes(nodes: int, environ: MutableMapping[str, str] = os.environ) -> ClusterEnv:
    """In a rank, before its script starts: rewrite the per-node variables its launcher set as if
    the ranks were dealt out in order to `nodes` nodes of one machine each; the rank's new place.
    A change for good, not patched: the script that runs next in this process reads them."""
    cluster = detect_cluster(environ)
    per_node = cluster.world_size // nodes
    node, local_rank = divmod(cluster.rank, per_node)
    # Slurm's per-node task lists ("2(x2)") are not single counts; the checker never runs under srun.
    local_sizes = [name for name in LOCAL_WORLD_SIZE_VARIABLES if not name.startswith("SLURM_")]
    for names, value in (
        (LOCAL_RANK_VARIABLES, local_rank),
        (local_sizes, per_node),
        (NODE_RANK_VARIABLES, node),
        (NODE_COUNT_VARIABLES, nodes),
    ):
        for name in names:
            if name in environ:  # only what the launcher set: each launcher names its own
                environ[name] = str(value)
    for name in HOST_VARIABLES:
        if name in environ:
            environ[name] = f"{environ[name]}-node{node}"
    environ["CUDA_VISIBLE_DEVICES"] = ""
    environ.setdefault("MASTER_ADDR", cluster.master_addr)  # else discovery would look for a multi-node rendezvous
    return detect_cluster(environ)


def device_index(value: Any) -> Optional[int]:
    """The CUDA device index `value` names: an int, "3" or "cuda:3", or a torch.device; None otherwise."""
    if isinstance(value, torch.device):
        return value.index if value.type == "cuda" else None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(?:cuda:)?(\d+)\s*", value)
        return int(match[1]) if match else None
    return None


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _text(node: Optional[ast.expr]) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _call_indices(call: ast.Call) -> list[ast.expr]:
    """The device index arguments of a call: torch.device("cuda", i), set_device(i), .cuda(i),
    torch.cuda.device(i), "cuda:{}".format(i), and DDP's device_ids=[i] / output_device=i."""
    name = _dotted(call.func)
    last = name.rsplit(".", 1)[-1] or getattr(call.func, "attr", "")
    keywords = {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}
    found: list[ast.expr] = []
    if last == "device":
        kind = call.args[0] if call.args else keywords.get("type")
        if (_text(kind) or "").startswith("cuda"):
            found += call.args[1:2] + ([keywords["index"]] if "index" in keywords else [])
        elif ".cuda." in f".{name}" and call.args:
            found.append(call.args[0])
    elif last in ("set_device", "cuda") and call.args:
        found.append(call.args[0])
    elif last == "format" and (_text(getattr(call.func, "value", None)) or "").startswith("cuda:") and call.args:
        found.append(call.args[0])
    if "device_ids" in keywords:
        found += [
            element
            for node in ast.walk(keywords["device_ids"])
            if isinstance(node, (ast.List, ast.Tuple))
            for element in node.elts
        ]
    if "output_device" in keywords:
        found.append(keywords["output_device"])
    return found


def _string_indices(node: ast.expr) -> list[ast.expr]:
    """The index in f"cuda:{i}", "cuda:%d" % i and "cuda:" + str(i)."""
    if isinstance(node, ast.JoinedStr):
        return [
            after.value
            for before, after in zip(node.values, node.values[1:])
            if (_text(before) or "").endswith("cuda:") and isinstance(after, ast.FormattedValue)
        ][:1]
    if isinstance(node, ast.BinOp) and _text(node.left):
        if isinstance(node.op, ast.Mod) and "cuda:%" in node.left.value:
            return [node.right.elts[0] if isinstance(node.right, ast.Tuple) and node.right.elts else node.right]
        if isinstance(node.op, ast.Add) and node.left.value.endswith("cuda:"):
            return [node.right]
    return []


def index_expressions(source: str) -> list[ast.expr]:
    """Every expression of `source` that names a CUDA device index (see the module's docstring)."""
    found: list[ast.expr] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            found += _call_indices(node)
        elif isinstance(node, ast.Assign):
            found += [
                node.value
                for target in node.targets
                if isinstance(target, ast.Subscript) and _text(target.slice) == "CUDA_VISIBLE_DEVICES"
            ]
        found += _string_indices(node) if isinstance(node, ast.expr) else []
    return found


class DeviceExpressions:
    """A script's device index expressions, each evaluated in the script's globals until it can be."""

    def __init__(self, script: str) -> None:
        source = Path(script).read_text()
        lines = source.splitlines()
        try:
            expressions = index_expressions(source)
        except SyntaxError:
            expressions = []  # the script cannot run either; its error says why
        self.pending = [
            (
                f"line {node.lineno}: {lines[node.lineno - 1].strip()}",
                compile(ast.Expression(body=node), script, "eval"),
            )
            for node in expressions
        ]

    def evaluate(self, namespace: dict[str, Any]) -> list[Device]:
        """The device indices of the expressions that evaluate now, which are then done."""
        found, pending = [], []
        for where, code in self.pending:
            try:
                value = eval(code, namespace)  # the script's own expression, in the script's own globals
            except Exception:  # a name not bound yet (or a function's local), a group already gone
                pending.append((where, code))
                continue
            index = device_index(value)
            if index is not None:
                found.append((index, where))
        self.pending = pending
        return found


def watch_set_device(record: Callable[[int, str], None]) -> None:
    """Have `record` told the index of every torch.cuda.set_device call (scripts look it up when they call it)."""
    set_device = torch.cuda.set_device

    def watched(device: Any) -> None:
        index = device_index(device)
        if index is not None:
            record(index, f"torch.cuda.set_device({device!r})")
        set_device(device)

    torch.cuda.set_device = watched


def weights_device(model: torch.nn.Module) -> list[Device]:
    """The GPU the model's weights are on (none on the CPU)."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cuda":
        return []
    return [(parameter.device.index or 0, f"its model's weights on {parameter.device}")]


def check_devices(observations: list[Observation], framework: Framework) -> list[Failure]:
    """Property 7: no rank picks its GPU by a global rank that is not its local rank."""
    for observation in observations:
        if observation.local_rank == observation.rank:
            continue  # on one node the two agree: nothing tells them apart
        for index, where in observation.devices:
            if index == observation.rank:
                return [
                    Failure(
                        "device",
                        f"rank {observation.rank} picks GPU {index}, its global rank ({where}), but "
                        f"it is local rank {observation.local_rank} on its node: each node numbers "
                        "its GPUs from 0, so pick the GPU by the local rank",
                        framework.device_keys,
                    )
                ]
    return []
