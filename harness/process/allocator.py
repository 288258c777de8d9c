"""CPU memory reuse: keep freed tensor memory in the process instead of handing it back every step
(or, under a memory cap, hand it back at once).

With glibc's defaults, a CPU training step returns the memory of its large activations and
gradients to the kernel when they are freed (heap trimming above a threshold that glibc moves as it
sees allocations), and gets fresh zeroed pages back on the next step, one page fault per 4 KiB. On
the workshop CNN at batch 64 that is about 4,400 faults and 11 ms of kernel time per 85 ms step.
`reuse_freed_memory` fixes both thresholds, as a caching allocator would: blocks under 32 MiB come
from the heap and stay there for the next step. The cost is that the process keeps its peak
working set (up to 1 GiB of freed heap) instead of shrinking between steps. `release`, the mode a
memory cap sets (harness.process.memory_cap), does the opposite: every block of 1 MiB or more is
mapped on its own and handed back when freed, so that the process holds what it uses.
"""

from __future__ import annotations

import ctypes
import os

CPU_MALLOC_MODES = ("reuse", "system", "release")
M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
# (mmap threshold, trim threshold) per mode that sets them. reuse: blocks under 32 MiB (the largest
# value glibc accepts on 64-bit) from the heap, kept there up to 1 GiB. release: every block of 1 MiB
# or more mapped on its own and unmapped when freed, so that what the process holds is what it
# uses: what a memory cap (harness.process.memory_cap) must see, where reuse's kept blocks and the
# heap's fragments would count against it (a 2-rank FSDP2 run of a 67M-parameter model peaked at
# 2.5 GiB of data segment with glibc's heap, 1.4 GiB so).
THRESHOLDS = {"reuse": (32 << 20, 1 << 30), "release": (1 << 20, 1 << 20)}
# Set by a user who tunes glibc's malloc or preloads another allocator; the harness then leaves it.
USER_MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
PRELOADED_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


_applied_in_this_process = ""  # the mode set last: glibc's settings are per process, and cannot be put back


def _is_glibc() -> bool:
    # Asks the C library itself (platform.libc_ver would scan the Python binary, tens of MB when static).
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # no confstr (Windows) or no such name (musl, macOS)
        return False


def _user_malloc_settings() -> list:
    named = [name for name in USER_MALLOC_VARIABLES if os.environ.get(name)]
    preload = os.environ.get("LD_PRELOAD", "")
    return named + [allocator for allocator in PRELOADED_ALLOCATORS if allocator in preload]


def reuse_freed_memory(mode: str) -> str:
    """Apply `--cpu-malloc` to this process (and the workers it forks); return what is in effect.

    Notebooks run several trainings in one process: once a mode is set, it stays for the process
    until another run sets another (glibc's own moving thresholds cannot be put back).
    """
    global _applied_in_this_process
    if mode == "system":
        return (
            f"{_applied_in_this_process} (set by an earlier run in this process)"
            if _applied_in_this_process
            else "system"
        )
    if not _is_glibc():
        return "system (not glibc)"
    user_settings = _user_malloc_settings()
    if user_settings:
        return f"system (user's {', '.join(user_settings)})"
    libc = ctypes.CDLL(None)
    mmap_threshold, trim_threshold = THRESHOLDS[mode]
    # Setting either threshold also stops glibc from moving them itself.
    if not (libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold) and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)):
        return "system (mallopt refused)"
    _applied_in_this_process = mode
    return mode
