"""The launchers: how N local processes of a Python program start under python, torchrun, mpirun,
horovodrun or deepspeed, and the environment they get. What runs in them is the caller's business
(harness.training.launch starts `harness train` ranks through these)."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from ..errors import UsageError, unknown_choice

LAUNCHERS = ("python", "torchrun", "mpirun", "horovodrun", "deepspeed")

# OpenMPI refuses to start as root without these; containers often lack shared-memory single copy.
OPENMPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
}


def free_port() -> int:
    """A TCP port nobody listens on right now, for one job's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tool(name: str) -> str:
    # Prefer the tool installed beside this interpreter (the project's venv), then PATH.
    beside = os.path.join(os.path.dirname(sys.executable), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if not found:
        raise UsageError(f"launcher {name!r} is not installed; run `make setup` or choose another with --launcher")
    return found


def launcher_command(launcher: str, num_processes: int, program: Sequence[str], port: Optional[int] = None) -> List[str]:
    """`launcher` starting `num_processes` copies of `python PROGRAM` (a script and its arguments, or
    -m MODULE ...) on this machine; rank and size reach them through the launcher's variables."""
    port = port or free_port()
    if launcher == "python":
        return [sys.executable, *program]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
                str(num_processes), "--master-addr", "127.0.0.1", "--master-port", str(port), *program]
    if launcher == "mpirun":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        return [_tool("mpirun"), *root, "-np", str(num_processes), "--oversubscribe", "--bind-to", "none",
                "-x", f"MASTER_PORT={port}", sys.executable, *program]
    if launcher == "horovodrun":
        return [_tool("horovodrun"), "--gloo", "-np", str(num_processes), "-H", f"localhost:{num_processes}",
                "--gloo-timeout-seconds", "120", sys.executable, *program]
    # Rank comes from the environment like every launcher; no --local_rank argument.
    module = ["--module", *program[1:]] if program[0] == "-m" else list(program)
    return [_tool("deepspeed"), "--num_gpus", str(num_processes), "--master_port", str(port), "--no_local_rank",
            *module]


def launch_environment(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment launched ranks get: OpenMPI's root switches plus unbuffered output."""
    env = dict(os.environ)
    for key, value in OPENMPI_ENV.items():
        env.setdefault(key, value)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # harness.training.loop sets each rank's threads itself (cores / local ranks); this only keeps
    # torchrun from printing its OMP_NUM_THREADS banner.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env
