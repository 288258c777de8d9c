"""Records of what a test starts outside its own process tree (network namespaces, Slurm's daemons),
so that a test process killed before it could clean up (CI's time limit, a ^C) leaves nothing running
for long: the next test to start the same kind of thing ends whatever a dead owner left behind.

A record is a JSON file in a directory under /run, which is a tmpfs: records are gone after a reboot,
as are the namespaces and daemons they list. It names its owner by pid and start time, so a pid the
kernel has since given to another process does not pass for the owner.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from harness.process.processes import start_time


def write_record(path: str, fields: dict[str, Any]) -> None:
    """`fields` and this process as their owner, into `path` (whole or not at all)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {**fields, "owner_pid": os.getpid(), "owner_start": start_time(os.getpid())}
    with open(path + ".tmp", "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


def stale_records(directory: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, record) of each record in `directory` whose owner is gone; the caller removes the path
    once it has ended what the record lists."""
    if not os.path.isdir(directory):
        return
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json"):
            continue  # a record being written (.tmp)
        path = os.path.join(directory, name)
        try:
            with open(path) as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if start_time(record["owner_pid"]) != record["owner_start"]:
            yield path, record
