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


def test_a_mode_stays_for_the_process_until_another_is_set(monkeypatch):
    """What release does to freed blocks wants a process whose heap no earlier test left fragmented:
    tests/integration/test_memory_cap.py measures it in one."""
    monkeypatch.setattr(allocator, "_applied_in_this_process", "")
    assert reuse_freed_memory("release") == "release"
    assert reuse_freed_memory("system") == "release (set by an earlier run in this process)"
    reuse_freed_memory("reuse")  # as the process's runs leave it
