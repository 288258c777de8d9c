"""Run a few CPU training steps of the workshop CNN under --cpu-malloc modes applied in turn (as
successive runs in one notebook would); print JSON with the mode in effect after the last and the
minor page faults per step (run as a script: malloc settings are per process)."""

from __future__ import annotations

import json
import resource
import sys

import torch
import torch.nn.functional as F

from harness.process.allocator import reuse_freed_memory
from harness.training.models import WorkshopCNN


def faults_per_step(steps: int = 10) -> float:
    torch.set_num_threads(1)
    model = WorkshopCNN()
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step() -> None:
        F.cross_entropy(model(images), labels).backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):  # first allocations
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


if __name__ == "__main__":
    mode = [reuse_freed_memory(requested) for requested in sys.argv[1:]][-1]
    print(json.dumps({"mode": mode, "faults_per_step": faults_per_step()}))
