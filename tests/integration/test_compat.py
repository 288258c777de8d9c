"""Version workarounds that need processes of their own (a process group per rank)."""

from __future__ import annotations

import subprocess
import sys

from harness.backends import compat
from harness.process.launchers import free_port

# In a fresh interpreter: what other tests in this process did to torch's stores must not decide it.
STORE_AFTER_DESTROY = """
import gc, socket, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
port = int(sys.argv[1])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
model = DistributedDataParallel(torch.nn.Linear(2, 2))
model(torch.ones(1, 2)).sum().backward()
dist.destroy_process_group()
del model
gc.collect()
with socket.socket() as client:
    print("listening" if client.connect_ex(("127.0.0.1", port)) == 0 else "closed")
"""


def test_a_group_ddp_used_still_listens_after_destroy_so_each_group_needs_a_port_of_its_own():
    result = subprocess.run(
        [sys.executable, "-c", STORE_AFTER_DESTROY, str(free_port())], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "listening", (
        "torch closes the store now: compat.rendezvous_port may be dropped"
    )
    before = compat.rendezvous_port(29500)
    compat.process_group_created()
    assert compat.rendezvous_port(29500) == before + 1
