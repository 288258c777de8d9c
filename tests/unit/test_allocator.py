"""--cpu-malloc reuse: a CPU step reuses the memory the previous step freed instead of faulting in
fresh pages (about 5,000 per step of the workshop CNN under glibc's defaults); users' own malloc
settings win."""

from __future__ import annotations

import pytest

from harness.process import allocator
from harness.process.allocator import reuse_freed_memory


@pytest.mark.parametrize(
    "variable, value, named",
    [
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0", "GLIBC_TUNABLES"),
        ("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "jemalloc"),
    ],
)
def test_other_allocator_settings_are_named_in_the_record(monkeypatch, variable, value, named):
    monkeypatch.setenv(variable, value)
    assert reuse_freed_memory("reuse") == f"system (user's {named})"


def test_system_mode_changes_nothing(monkeypatch):
    # In a process where no earlier run set reuse (an earlier test in this process may have trained).
    monkeypatch.setattr(allocator, "_applied_in_this_process", "")
    assert reuse_freed_memory("system") == "system"


def test_release_hands_freed_blocks_back_and_stays_until_another_mode_is_set(monkeypatch):
    """Under release, a freed 16 MiB block leaves the data segment at once; under reuse it stays."""

    monkeypatch.setattr(allocator, "_applied_in_this_process", "")
    held = {}
    for mode in ("reuse", "release"):
        assert reuse_freed_memory(mode) == mode
        # The most handed back of three tries: another thread of this process (pytest-xdist's, torch's)
        # may map memory between the two readings, which once hid 4 MiB of a freed block.
        held[mode] = max(_handed_back_by_freeing_16_mib() for _ in range(3))
    assert held["release"] >= 16 << 20 and held["reuse"] < 16 << 20
    assert reuse_freed_memory("system") == "release (set by an earlier run in this process)"
    reuse_freed_memory("reuse")  # as the process's runs leave it


def _handed_back_by_freeing_16_mib() -> int:
    import torch

    from harness.process.memory_cap import data_segment_bytes

    block = torch.ones(4 << 20)  # 16 MiB, under reuse's mmap threshold: from the heap
    before = data_segment_bytes()
    del block
    return before - data_segment_bytes()
