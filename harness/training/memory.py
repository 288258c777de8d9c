"""A rank's peak memory over its timed window, measured the same way under every backend (the
record's `memory`).

On a GPU (or any accelerator): torch.accelerator.max_memory_allocated, what torch's caching
allocator handed out at most (not what it reserved from the driver), its peak reset when the window
opens. On the CPU: the process's resident-set peak (VmHWM in /proc/self/status), reset when the
window opens by writing 5 to /proc/self/clear_refs (Linux >= 4.0), so that neither start-up, nor
model construction before sharding, nor evaluation with its larger batches is in the figure; where
the kernel refuses the reset (or without /proc: getrusage's ru_maxrss), the peak is the whole
process's, and the record's `scope` says so.
"""

from __future__ import annotations

import resource
import sys
from typing import Any, Dict, List, Tuple

import torch

CUDA_ALLOCATOR = "cuda_allocator"  # on another accelerator "<device type>_allocator", e.g. xpu_allocator
RSS_PEAK = "rss_peak"


class WindowPeak:
    """The highest peak memory of the timed windows: reset as a window opens, read as it closes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0.0
        self.source = CUDA_ALLOCATOR
        self.whole_process = False  # a reset was refused: the figure starts with the process

    def open(self) -> None:
        if self.device.type != "cpu":
            torch.accelerator.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as clear_refs:
                clear_refs.write("5")  # resets VmHWM to the current resident set
        except OSError:
            self.whole_process = True

    def close(self) -> None:
        peak, self.source = peak_memory(self.device)
        self.bytes = max(self.bytes, peak)

    def result(self) -> Tuple[float, str, bool]:
        """(peak bytes, source, whether it is the whole process's): a run whose window never
        opened (fewer steps than the timing warm-up) reports the process's peak so far."""
        if self.bytes == 0.0:
            peak, source = peak_memory(self.device)
            return peak, source, True
        return self.bytes, self.source, self.whole_process


def peak_memory(device: torch.device) -> Tuple[float, str]:
    """(this rank's peak memory in bytes, its source: CUDA_ALLOCATOR or RSS_PEAK)."""
    if device.type == "cpu":
        return float(_resident_peak()), RSS_PEAK
    return float(torch.accelerator.max_memory_allocated(device)), f"{device.type}_allocator"


def _resident_peak() -> int:
    """The process's resident-set peak in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # the kernel writes kB
    except OSError:
        pass  # not Linux: getrusage below
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, kB elsewhere


def memory_section(peak_bytes_per_rank: List[float], source: str, whole_process: bool) -> Dict[str, Any]:
    """The record's `memory` section from every rank's peak (gathered by harness.training.timing)."""
    measured = "resident-set peak" if source == RSS_PEAK else "allocator's peak"
    scope = (f"the process's {measured} since it started (the kernel refused to reset it)" if whole_process
             else f"the {measured} over the timed window (reset as it opened)")
    return {"peak_bytes_per_rank": [int(value) for value in peak_bytes_per_rank], "source": source, "scope": scope}
