"""Discovery under the real launchers: each starts ranks that report what they discovered."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import run


def _discovered(stdout: str):
    # horovodrun prefixes lines with "[rank]<stdout>:", the deepspeed launcher can run two ranks'
    # lines together, and launchers log dicts of their own: pick out each record by its shape.
    rows = [json.loads(match) for match in re.findall(r'\{"default_threads"[^{}]*\}', stdout)]
    return sorted((r["rank"], r["world_size"], r["local_rank"], r["local_world_size"]) for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "mpirun", "horovodrun", "deepspeed"])
def test_real_launchers_are_discovered(launcher):
    from harness.training.launch import launch_command

    command = launch_command(2, "ddp", [], launcher)
    # Replace `harness train ...` with `harness env`, keeping the launcher's own arguments.
    cut = command.index("train") if "train" in command else len(command)
    command = [*command[:cut], "env"]
    result = run(command, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _discovered(result.stdout) == [(0, 2, 0, 2), (1, 2, 1, 2)], result.stdout
