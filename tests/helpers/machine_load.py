"""Outside load as a test reads it around a measurement: the machine is shared, so a contention
verdict is checked against what other processes did just before and just after."""

from __future__ import annotations

import time

from harness.training.contention import cpu_times, usable_cpus


def outside_share(seconds: float) -> float:
    """Other processes' share of this process's usable CPUs over `seconds` while the test idles."""
    cpus = usable_cpus()
    before = cpu_times(cpus)
    time.sleep(seconds)
    after = cpu_times(cpus)
    assert before is not None and after is not None, "no /proc/stat on this machine"
    return (after[0] - before[0]) / (after[2] - before[2])
