"""Several trainings in the same two processes, as a notebook's MPI engines run them.

Run as `mpirun -np 2 python tests/helpers/repeat_runs.py OUT_DIR` (tests/integration/test_repeat_runs.py does). Each
rank trains every registered distributed backend, then each again (ddp -> horovod -> deepspeed ->
ddp -> horovod -> deepspeed); then ddp and deepspeed in a process
group it made itself, deepspeed again in a second group of its own (DeepSpeed caches the groups it
makes: a stale one breaks the next run), and horovod after its own hvd.init(). It writes
OUT_DIR/rank<R>.json with what it saw after each run: the record's launcher and tuning, whether the
process state was as before, and the weights' file.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from backend_cases import DISTRIBUTED  # this script's directory, tests/helpers/, is on sys.path
from mpi4py import MPI  # MPI starts first, as in an ipyparallel MPI engine

import harness

SEQUENCE = tuple(os.environ.get("REPEAT_SEQUENCE", ",".join(DISTRIBUTED * 2)).split(","))
# Runs in process groups the script makes itself, one group per tuple.
OWN_GROUP_SEQUENCES = (("ddp", "deepspeed"), ("deepspeed",))
# Every run must end with the weights of one process on the doubled batch (harness.study.scaling.equivalence).
COMMON = dict(
    task_args={"model": "cnn", "dataset": "digits", "dropout": 0.0},
    seed=0,
    lr=0.05,
    lr_scaling="none",
    batch_size=16,
    max_steps=10,
    threads=1,
    eval_every=0,
    calibration_steps=0,
    timing_warmup_steps=1,
)


def process_state() -> dict:
    return {
        "environ": dict(os.environ),
        "threads": torch.get_num_threads(),
        "process_group": dist.is_initialized(),
        "rng": torch.get_rng_state().sum().item(),
    }


def changes(before: dict, after: dict) -> list:
    """What a run left behind: changed environment variables and other process state."""
    keys = set(before["environ"]) | set(after["environ"])
    left = [f"env {key}" for key in sorted(keys) if before["environ"].get(key) != after["environ"].get(key)]
    return left + [name for name in ("threads", "process_group", "rng") if before[name] != after[name]]


def main(out: str) -> None:
    rank = MPI.COMM_WORLD.Get_rank()
    seen = []
    for number, backend in enumerate(SEQUENCE):
        before = process_state()
        path = os.path.join(out, f"{number}-{backend}.pt")
        record = harness.train(harness.TrainConfig(backend=backend, save_model=path, **COMMON))
        seen.append(
            {
                "backend": backend,
                "launcher": record["launcher"],
                "tuning": record["tuning"],
                "left_behind": changes(before, process_state()),
                "weights": path,
                "train_function": repr(harness.train),
            }
        )

    # A process group the caller made is used and left as it was. (On ports of their own: torch keeps
    # a store listening on the ports of groups DDP used, see harness/backends/torch_distributed.py.)
    for number, backends in enumerate(OWN_GROUP_SEQUENCES):
        port = int(os.environ["MASTER_PORT"]) + 100 + number  # mpirun passes MASTER_PORT (harness.process.launchers)
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=MPI.COMM_WORLD.Get_size()
        )
        for backend in backends:
            path = os.path.join(out, f"own-group-{number}-{backend}.pt")
            record = harness.train(harness.TrainConfig(backend=backend, save_model=path, **COMMON))
            seen.append(
                {
                    "backend": backend,
                    "launcher": record["launcher"],
                    "weights": path,
                    "kept": dist.is_initialized() and dist.get_world_size() == 2,
                }
            )
        dist.destroy_process_group()

    # Horovod that the caller initialised is used and left initialised.
    import horovod.torch as hvd

    hvd.init()
    path = os.path.join(out, "own-horovod.pt")
    record = harness.train(harness.TrainConfig(backend="horovod", save_model=path, **COMMON))
    seen.append({"backend": "horovod", "launcher": record["launcher"], "weights": path, "kept": hvd.is_initialized()})
    hvd.shutdown()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(seen, handle)


if __name__ == "__main__":
    main(sys.argv[1])
