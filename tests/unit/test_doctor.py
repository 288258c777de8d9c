"""`harness doctor` on faked nodes: the environment, PATH, GPUs and backends are the test's own, so
each line and the exit status (0 ok, 1 warnings, 2 a problem that stops a job) can be made to fail."""

from __future__ import annotations

import json
import os
import stat

from harness.cli import main
from harness.process.accelerator import Accelerator
from harness.study.jobs.doctor import DoctorReport, Node, diagnose, file_system_type, identify_site

ALL_READY = {"none": None, "ddp": None, "horovod": None, "deepspeed": None, "fsdp": None}


def _program(directory, name: str) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def _node(tmp_path, environ=None, programs=(), gpus=0, backends=None, hostname="laptop.example.org") -> Node:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for program in programs:
        _program(bin_dir, program)
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    base = {"PATH": str(bin_dir), "HOME": str(home), "USER": "me", "JOB_DIR": str(tmp_path / "scratch" / "job")}
    return Node(
        environ={**base, **(environ or {})},
        hostname=hostname,
        accelerator=lambda: Accelerator("cuda", gpus) if gpus else Accelerator("cpu", 0),
        backends=lambda: dict(backends or ALL_READY),
        mounts=str(tmp_path / "mounts"),
    )


def _line(report: DoctorReport, topic: str):
    return next(finding for finding in report.findings if finding.topic == topic)


def test_off_site_a_plain_node_is_all_ok_and_says_it_is_at_no_known_site(tmp_path):
    report = diagnose(_node(tmp_path, programs=["mpirun", "ompi_info", "sbatch", "squeue"]))
    assert report.site is None and report.status == 0, report.lines()
    assert "not at a known site" in _line(report, "site").text
    assert _line(report, "mpi").text.startswith("OpenMPI")
    assert "slurm (sbatch squeue)" in _line(report, "scheduler").text
    assert "backends ready: none, ddp, horovod, deepspeed, fsdp" in _line(report, "python").text
    assert [f.topic for f in report.findings] == [
        "site", "modules", "python", "mpi", "network plugin", "gpus", "scheduler", "job directory"
    ]  # fmt: skip


def test_sites_are_identified_from_host_names_and_variables():
    assert identify_site({}, "x3005c0s13b0n0.hsn.cm.polaris.alcf.anl.gov").name == "polaris"
    assert identify_site({}, "x4102c5s2b0n0.hostmgmt2000.cm.aurora.alcf.anl.gov").name == "aurora"
    assert identify_site({"NERSC_HOST": "perlmutter"}, "nid001234").name == "perlmutter"
    assert identify_site({"LMOD_SYSTEM_NAME": "frontier"}, "login03").name == "frontier"
    assert identify_site({"NERSC_HOST": "perlmutter-old"}, "my-polaris-laptop") is None


def test_a_site_default_backend_missing_is_a_problem_and_the_status_is_two(tmp_path):
    missing = {**ALL_READY, "deepspeed": "backend 'deepspeed' needs deepspeed, which is not installed; pip ..."}
    node = _node(tmp_path, environ={"NERSC_HOST": "perlmutter"}, backends=missing)
    assert diagnose(node).status < 2  # Perlmutter studies ddp and fsdp by default
    report = diagnose(node, site="polaris")  # Polaris studies deepspeed too
    python = _line(report, "python")
    assert python.level == "problem" and python.text.endswith("polaris studies by default deepspeed")
    assert "needs deepspeed" in python.text and report.status == 2
    asked = _node(tmp_path, environ={"BACKENDS": "ddp,deepspeed"}, backends=missing)  # off-site, as a job reads it
    assert _line(diagnose(asked), "python").text.endswith("BACKENDS asks for deepspeed")


def test_gpus_missing_at_a_gpu_site_warn_on_a_login_node_and_stop_a_job(tmp_path):
    login = diagnose(_node(tmp_path), site="polaris")
    assert _line(login, "gpus").level == "warning" and "run doctor there" in _line(login, "gpus").text
    job = diagnose(_node(tmp_path, environ={"PBS_JOBID": "1.polaris"}), site="polaris")
    assert _line(job, "gpus").level == "problem" and job.status == 2
    bound = diagnose(_node(tmp_path, environ={"CUDA_VISIBLE_DEVICES": "3,2,1,0"}, gpus=4), site="polaris")
    assert _line(bound, "gpus").text == "4 cuda (CUDA_VISIBLE_DEVICES=3,2,1,0)"


def test_the_network_plugin_is_looked_for_on_ld_library_path(tmp_path):
    libs = tmp_path / "ofi"
    libs.mkdir()
    (libs / "librccl-net.so").write_text("")
    found = diagnose(_node(tmp_path, environ={"LD_LIBRARY_PATH": str(libs)}, gpus=8), site="frontier")
    assert (
        _line(found, "network plugin").level == "ok" and "librccl-net.so found" in _line(found, "network plugin").text
    )
    lost = diagnose(_node(tmp_path, gpus=8), site="frontier")
    assert _line(lost, "network plugin").level == "problem" and "rccl-net-plugin" in _line(lost, "network plugin").text
    assert _line(diagnose(_node(tmp_path), site="frontier"), "network plugin").level == "warning"  # no GPUs here


def test_mpi_family_and_launcher_variables(tmp_path):
    cray = _node(tmp_path, environ={"CRAY_MPICH_DIR": "/opt/cray/mpich", "PMI_RANK": "0"}, programs=["mpiexec"])
    text = _line(diagnose(cray), "mpi").text
    assert text.startswith("Cray MPICH") and "PMI_RANK (mpich)" in text
    hydra = tmp_path / "mpich"
    hydra.mkdir()
    for program in ("mpiexec", "hydra_pmi_proxy"):
        _program(hydra, program)
    assert _line(diagnose(_node(tmp_path, environ={"PATH": str(hydra)})), "mpi").text.startswith("MPICH")
    nothing = diagnose(_node(tmp_path, environ={"PATH": str(tmp_path / "no-bin")}), site="frontier")
    assert _line(nothing, "mpi").level == "warning" and "srun, not on PATH" in _line(nothing, "mpi").text


def test_the_job_directory_warns_under_home_and_defaults_to_the_sites_scratch(tmp_path):
    home = diagnose(_node(tmp_path, environ={"JOB_DIR": str(tmp_path / "home" / "runs")}))
    assert _line(home, "job directory").level == "warning" and "under $HOME" in _line(home, "job directory").text
    scratch = tmp_path / "pscratch"
    node = _node(tmp_path, environ={"JOB_DIR": "", "SCRATCH": str(scratch), "NERSC_HOST": "perlmutter"})
    line = _line(diagnose(node), "job directory")
    assert line.level == "ok" and line.text.startswith(f"{scratch}/harness-runs on ")


def test_a_job_directory_that_cannot_be_made_is_a_problem(tmp_path):
    (tmp_path / "a-file").write_text("")
    report = diagnose(_node(tmp_path, environ={"JOB_DIR": str(tmp_path / "a-file" / "job")}))
    line = _line(report, "job directory")
    assert line.level == "problem" and "cannot be written" in line.text and report.status == 2


def test_file_system_type_is_the_longest_mount_above_the_path(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text("rootfs / ext4 rw 0 0\nlustre /lus/eagle lustre rw 0 0\nnfs /lus/eagle/x nfs rw 0 0\n")
    assert file_system_type("/lus/eagle/projects/p", str(mounts)) == "lustre"
    assert file_system_type("/home/me", str(mounts)) == "ext4"
    assert file_system_type("/home/me", str(tmp_path / "absent")) == "unknown"


def test_the_cli_prints_json_and_exits_with_the_worst_level(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("JOB_DIR", str(tmp_path / "job"))
    status = main(["doctor", "--json", "--site", "generic-slurm"])
    report = json.loads(capsys.readouterr().out)
    assert report["site"] == "generic-slurm" and report["status"] == status
    assert {check["topic"] for check in report["checks"]} >= {"python", "gpus", "job directory"}
