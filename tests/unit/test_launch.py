"""`harness launch` builds the exact command of a real launcher, and --dry-run only prints it."""

from __future__ import annotations

import sys

import pytest


def test_each_backend_defaults_to_its_own_launcher():
    from harness.training.launch import launch_command

    assert launch_command(1, "none", [])[:3] == [sys.executable, "-m", "harness"]
    assert "torch.distributed.run" in launch_command(2, "ddp", [])
    assert launch_command(2, "horovod", [])[0].endswith("horovodrun")
    assert launch_command(2, "deepspeed", [])[0].endswith("deepspeed")


def test_each_local_launcher_builds_exactly_its_command(monkeypatch):
    from harness.process import launchers

    monkeypatch.setattr(launchers, "_tool", lambda name: name)  # the command, wherever the tool is installed
    monkeypatch.setattr(launchers.os, "geteuid", lambda: 1000)
    program = ["-m", "harness", "train", "--epochs", "2"]
    python = sys.executable
    expected = {
        "python": [python, *program],
        "torchrun": [
            python,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            "3",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            "29411",
            *program,
        ],
        "mpirun": [
            "mpirun",
            "-np",
            "3",
            "--oversubscribe",
            "--bind-to",
            "none",
            "-x",
            "MASTER_PORT=29411",
            python,
            *program,
        ],
        "horovodrun": [
            "horovodrun",
            "--gloo",
            "-np",
            "3",
            "-H",
            "localhost:3",
            "--gloo-timeout-seconds",
            "120",
            python,
            *program,
        ],
        "deepspeed": [
            "deepspeed",
            "--num_gpus",
            "3",
            "--master_port",
            "29411",
            "--no_local_rank",
            "--module",
            "harness",
            "train",
            "--epochs",
            "2",
        ],
    }
    assert set(expected) == set(launchers.LOCAL_LAUNCHERS)
    for name, command in expected.items():
        assert launchers.launcher_command(name, 3, program, port=29411) == command, name


def test_a_site_launcher_is_no_local_choice():
    from harness.errors import UsageError
    from harness.process.launchers import LAUNCHERS, launcher_command

    with pytest.raises(UsageError, match="unknown launcher 'srun'; choose one of python, torchrun, mpirun"):
        launcher_command("srun", 2, ["-m", "harness", "env"])
    with pytest.raises(UsageError, match="across a pbs allocation only"):
        LAUNCHERS["mpiexec"].command(2, ["-m", "harness", "env"])


def test_every_launcher_name_in_the_package_is_a_row_of_the_one_table():
    """Backends, discovery, the sweep and the notebook engines name launchers the table holds."""
    from harness.backends import BACKENDS
    from harness.process.discovery import RANK_VARIABLES
    from harness.process.launchers import LAUNCHERS, LOCAL_LAUNCHERS, MPI_FAMILIES
    from harness.study.scaling.sweep import PBS_TEMPLATE, SLURM_TEMPLATE
    from harness.workshop.engines import BATCH_TEMPLATES, MPI_ARGUMENTS

    for backend in BACKENDS.values():
        assert backend.local_launcher in backend.local_launchers, backend.name
        assert set(backend.local_launchers) <= set(LOCAL_LAUNCHERS), backend.name
    reported = {family for launcher in LAUNCHERS.values() for family in launcher.families}
    assert reported == {family for _, family in RANK_VARIABLES} | {"none"}  # "none": a plain process
    assert MPI_FAMILIES == {"openmpi", "mpich", "pals"}
    assert set(MPI_ARGUMENTS) == MPI_FAMILIES | {"unknown"}  # what mpi_flavour tells, one entry each
    schedulers = {launcher.scheduler: launcher for launcher in LAUNCHERS.values() if launcher.scheduler}
    assert set(BATCH_TEMPLATES) == set(schedulers)
    assert PBS_TEMPLATE == "mpiexec -n {ranks} --ppn {ppn} {python} -m harness train {args}"
    assert SLURM_TEMPLATE == (
        "srun --nodes {nodes} --ntasks {ranks} --ntasks-per-node {ppn} {python} -m harness train {args}"
    )
    for scheduler, template in BATCH_TEMPLATES.items():
        assert f"\n{schedulers[scheduler].executable} " in template, scheduler


def test_a_rendezvous_port_is_below_the_ephemeral_range_with_its_span_free(monkeypatch):
    """Ports above a job's first serve its later process groups (notebook engines): all must be free,
    and none in the range the kernel hands to outgoing connections."""
    import socket

    from harness.process import launchers

    with open("/proc/sys/net/ipv4/ip_local_port_range") as handle:
        ephemeral_start = int(handle.read().split()[0])
    for span in (1, 128):
        port = launchers.free_port(span=span)
        assert launchers.RENDEZVOUS_PORTS_FROM <= port and port + span <= ephemeral_start
        assert all(launchers._bindable(candidate) for candidate in range(port, port + span))
    free = launchers.free_port(span=4)
    with socket.create_server(("0.0.0.0", 0)) as taken:  # a port someone listens on, not a port finder
        busy = taken.getsockname()[1]
        picks = iter([busy - 2, free])  # first a start whose span holds the listening port

        class Picker:
            def choice(self, candidates: range) -> int:
                return next(picks)

        monkeypatch.setattr(launchers, "_PORT_PICKER", Picker())
        monkeypatch.setattr(launchers, "_EPHEMERAL_RANGE", "/nonexistent")  # the default range then
        monkeypatch.setattr(launchers, "_DEFAULT_EPHEMERAL_START", 65536)
        assert launchers.free_port(span=4) == free
