"""The record's peak memory covers the timed window only: what a rank held before it (start-up, the
full model before sharding) and after it (evaluation) is not in the figure."""

from __future__ import annotations

import numpy as np
import torch

from harness.training.memory import RSS_PEAK, WindowPeak, memory_section, peak_memory

MIB = 2 ** 20


def _touch(mebibytes: int) -> np.ndarray:
    return np.ones(mebibytes * MIB, dtype=np.uint8)  # written, so resident


def test_the_window_peak_leaves_out_what_the_process_held_before_the_window():
    before = _touch(400)
    del before  # a large block goes back to the kernel; VmHWM keeps the 400 MiB
    process_peak, _ = peak_memory(torch.device("cpu"))
    window = WindowPeak(torch.device("cpu"))
    window.open()
    inside = _touch(50)
    window.close()
    del inside
    peak, source, whole_process = window.result()
    assert (source, whole_process) == (RSS_PEAK, False)
    assert peak < process_peak - 300 * MIB, (peak / MIB, process_peak / MIB)


def test_the_highest_window_counts_and_a_run_without_a_window_reports_the_whole_process():
    window = WindowPeak(torch.device("cpu"))
    assert window.result()[2] is True  # never opened: the process's peak, said so
    window.open()
    big = _touch(200)
    window.close()
    del big
    first = window.bytes
    window.open()
    window.close()
    assert window.result()[0] == first  # the second, smaller window does not lower it


def test_the_section_says_what_the_figure_covers():
    assert "timed window" in memory_section([1.0], RSS_PEAK, False)["scope"]
    assert "since it started" in memory_section([1.0], RSS_PEAK, True)["scope"]
