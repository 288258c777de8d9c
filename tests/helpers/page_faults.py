"""Run a few CPU training steps of the workshop CNN under --cpu-malloc modes applied in turn (as
successive runs in one notebook would); print JSON with the mode in effect after the last and the
minor page faults of the median step (run as a script: malloc settings are per process).

The median, not the mean: with reuse, most steps fault 0 times, but now and then one step faults
hundreds or thousands of times (likely the heap growing, or the kernel moving pages on a loaded
machine). One such step in ten once put the mean of a reuse run at 461 in CI, above a tenth of the
system run's. The problem `--cpu-malloc reuse` removes is the faulting of every step, which the
median measures."""

from __future__ import annotations

import json
import resource
import statistics
import sys

import torch
import torch.nn.functional as F

from harness.process.allocator import reuse_freed_memory
from harness.tasks.models import WorkshopCNN


def median_step_faults(steps: int = 10) -> float:
    torch.set_num_threads(1)
    model = WorkshopCNN()
    images, labels = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def step() -> None:
        F.cross_entropy(model(images), labels).backward()
        model.zero_grad(set_to_none=True)

    for _ in range(3):  # first allocations
        step()
    faults = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(faults)


if __name__ == "__main__":
    mode = [reuse_freed_memory(requested) for requested in sys.argv[1:]][-1]
    print(json.dumps({"mode": mode, "median_step_faults": median_step_faults()}))
