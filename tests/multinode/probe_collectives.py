"""Run on each of two nodes: time each collective kind, bare torch.distributed over gloo, on a buffer
of PROBE_ELEMENTS float32 (the median of REPEATS: one transfer on a shaped TCP link varies by 20%),
and print rank 0's seconds per kind as one JSON line. Usage:
    probe_collectives.py RANK MASTER_HOST PORT
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

PROBE_ELEMENTS = 1_200_000  # 4.8 MB, the workshop CNN's gradients
REPEATS = 3


def main() -> None:
    rank, master, port = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=2)
    whole, half = torch.zeros(PROBE_ELEMENTS), torch.zeros(PROBE_ELEMENTS // 2)
    calls = {
        "all_reduce": lambda: dist.all_reduce(whole),
        "all_gather": lambda: dist.all_gather_into_tensor(whole, half),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(half, whole),
        "broadcast": lambda: dist.broadcast(whole, src=0),
    }
    seconds = {}
    for kind, call in calls.items():
        times = []
        for _ in range(REPEATS):
            dist.barrier()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        seconds[kind] = statistics.median(times)
    if rank == 0:
        print(json.dumps({"bytes": whole.numel() * whole.element_size(), "seconds": seconds}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
