"""The job templates in submissions/, run for real: thin scripts around `harness study`.

- Slurm is real: munged, slurmctld and slurmd from Debian's packages, started here with a private
  configuration (tests/helpers/slurm_cluster.py) plus two partitions where one preempts the other with a
  grace time; `sbatch submissions/slurm-cpu.sbatch` runs a whole study, a job warned before its
  time limit (`scancel --signal=USR1 --batch`) checkpoints, resubmits itself and ends with the
  weights of an uninterrupted run, a preempted one (SIGTERM to its steps, grace time) continues in
  a new job, and `perlmutter.sbatch`, cancelled, checkpoints and stays gone. Jobs are polled every
  0.5 s (not `sbatch --wait`) and write their output under tmp_path.
- PBS is emulated (no PBS package exists for Debian), only what is missing: tests/pbs_emulation
  has a `qsub` with Polaris's admission rules and its routing queue (prod -> small/medium/large)
  that runs jobs as PBS does, `qstat -f` (wrapped at 78 columns) and `qstat -fF json`, `qsig`, a
  Cray-PALS-like `mpiexec` that starts the ranks through OpenMPI's mpirun with PALS's rank variables,
  and a login profile with no-op `module` and `conda`. `submissions/polaris.sc` itself runs
  unchanged (test_job_templates_pbs.py, with this module's helpers).
- Every template, helper and emulated command passes shellcheck, each template in its own test.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Callable

import pytest

from harness.study.sites import load_site
from harness.training.record import read_records
from tests.conftest import REPO, launch
from tests.helpers.slurm_cluster import SlurmClient, SlurmCluster, SlurmUnavailable, check_installed
from tests.helpers.weights import load_weights, max_abs_difference

SUBMISSIONS = os.path.join(REPO, "submissions")
EMULATION = os.path.join(REPO, "tests", "pbs_emulation")
SLURM_CPU = os.path.join(SUBMISSIONS, "slurm-cpu.sbatch")
PERLMUTTER = os.path.join(SUBMISSIONS, "perlmutter.sbatch")
POLARIS = os.path.join(SUBMISSIONS, "polaris.sc")
# Tiny runs: the point is the job's plumbing, not the numbers.
QUICK_TRAIN_ARGS = "--eval-every 0 --calibration-steps 2 --timing-warmup-steps 2"
STUDY = dict(
    RANKS="1 2",
    STEPS="12",
    CHECKPOINT_EVERY="10",
    BATCH_SIZE="32",
    THREADS="1",
    MODEL="cnn",
    DATASET="digits",
    PRECISION="fp32",
    TRAIN_ARGS=QUICK_TRAIN_ARGS,
    PYTHON_ENV="venv",
    SITE_MODULES="",
)
# Polaris' PYTHON_ENV=venv is a venv layered on the conda; here the kit's own stands in for it.
POLARIS_STUDY = dict(STUDY, VENV=os.path.join(REPO, ".venv"))
# Preemption runs: 40 steps (23 per epoch at 2 x 32 of the 1,500 digits, so the resumed run crosses
# an epoch), a checkpoint every 5, so the signal surely lands mid-run; dropout on, so the resumed run
# must restore every RNG to match.
PREEMPTED_STEPS = 40
PREEMPTED_STUDY = dict(STUDY, RANKS="2", STEPS=str(PREEMPTED_STEPS), CHECKPOINT_EVERY="5")
FIGURE_KINDS = ("throughput", "efficiency", "breakdown")
JOB_TIMEOUT_S = 600


def wait_for(condition: Callable[[], bool], timeout: float, what: str, details: Callable[[], str]) -> None:
    """Poll `condition` until it holds; fail the test naming `what` (and `details()`) at `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f} s\n{details()}", pytrace=False)
        time.sleep(0.5)


def read_text(path: str) -> str:
    """The file's text; empty while it does not exist yet."""
    if not os.path.exists(path):
        return ""
    with open(path) as handle:
        return handle.read()


def job_events(job_dir: str) -> list[list[str]]:
    """jobs.txt as [time, job id, event] rows."""
    return [line.split("\t") for line in read_text(os.path.join(job_dir, "jobs.txt")).splitlines()]


def job_outputs(directory: str) -> str:
    """Every job output file under `directory`, for failure messages."""
    parts = []
    for path in sorted(
        glob.glob(os.path.join(directory, "**", "*.out"), recursive=True)
        + glob.glob(os.path.join(directory, "**", "*.o[0-9]*"), recursive=True)
    ):
        parts.append(f"--- {path}\n{read_text(path)[-6000:]}")
    return "\n".join(parts)


def has_checkpoint(run_directory: str) -> bool:
    return bool(glob.glob(os.path.join(run_directory, "step-*")))


def assert_job_directory(
    job_dir: str, backends: Sequence[str], ranks: Sequence[int], launcher: str, launch_word: str
) -> list[dict]:
    """What every job template leaves in its one job directory; returns the study's records."""
    records = read_records([os.path.join(job_dir, "results.jsonl")])
    name = os.path.basename(job_dir)
    assert sorted((r["backend"], r["world_size"]) for r in records) == sorted(
        (backend, n) for backend in backends for n in ranks
    ), "one record per backend x rank count"
    for record in records:
        order = record["tags"].pop("order")  # each round's runs in a seeded random order, recorded
        assert record["tags"] == {"sweep_id": name, "scaling": "weak", "repeat": "0", "order_seed": "0"}
        assert order.endswith(f"/{len(records)}")
        assert record["launcher"] == launcher
    for kind in FIGURE_KINDS:
        for extension in ("png", "svg", "json"):
            assert os.path.getsize(os.path.join(job_dir, "figures", f"scaling-{kind}.{extension}")) > 0
    report = read_text(os.path.join(job_dir, "report.md"))
    assert "Weak scaling" in report and all(re.search(rf"^\|\s+{backend}\b", report, re.M) for backend in backends)
    page = read_text(os.path.join(job_dir, "report.html"))  # the report a person opens, figures inside
    assert page.count("data:image/png;base64,") >= 2 and "Each run and its contention" in page
    # Predicted before the first run (the generic profiles have no network figures: it says so).
    assert os.path.getmtime(os.path.join(job_dir, "prediction.json")) <= min(
        os.path.getmtime(p) for p in glob.glob(os.path.join(job_dir, "logs", "*.log"))
    )
    logs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(job_dir, "logs", "*.log")))
    assert len(logs) == len(records) and all(
        any(f"-{b}-{n}r-rep0.log" in log for log in logs) for b in backends for n in ranks
    ), logs
    commands = [
        line
        for line in read_text(os.path.join(job_dir, "logs", "commands.txt")).splitlines()
        if line and not line.startswith("#")
    ]
    assert any(c.endswith("python -m harness env") and c.startswith(launch_word) for c in commands)
    runs = [shlex.split(c) for c in commands if " -m harness train " in c]
    assert {(c[c.index("--backend") + 1]) for c in runs} == set(backends)
    assert all(c[0] == launch_word for c in runs)
    discovery = [
        json.loads(line)
        for path in glob.glob(os.path.join(job_dir, "discovery-*.jsonl"))
        for line in read_text(path).splitlines()
    ]
    assert discovery, "the first step prints what discovery sees"
    assert all(d["launcher"] == launcher and d["world_size"] == max(ranks) for d in discovery)
    assert {d["rank"] for d in discovery} == set(range(max(ranks)))
    assert os.path.exists(os.path.join(job_dir, "study.json"))
    assert job_events(job_dir)[-1][2] == "study complete"
    return records


# -- shellcheck and the helpers on their own -------------------------------------------------------

TEMPLATES = ("polaris.sc", "perlmutter.sbatch", "aurora.sc", "frontier.sbatch", "slurm-cpu.sbatch")
TEMPLATE_MAX_LINES = 80


def shellcheck(paths: Sequence[str]) -> None:
    if not shutil.which("shellcheck"):
        pytest.fail("shellcheck is not installed; run `make setup` as root (it installs it)", pytrace=False)
    result = subprocess.run(
        ["shellcheck", "-x", *[os.path.relpath(p, REPO) for p in paths]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("template", TEMPLATES)
def test_each_template_is_thin_and_passes_shellcheck(template):
    path = os.path.join(SUBMISSIONS, template)
    shellcheck([path])
    lines = read_text(path).splitlines()
    assert len(lines) <= TEMPLATE_MAX_LINES, f"{template} has {len(lines)} lines"
    assert lines[-1].startswith("exec python -m harness study --site ")


def test_every_helper_and_emulated_command_passes_shellcheck():
    helpers = [os.path.join(SUBMISSIONS, name) for name in sorted(os.listdir(SUBMISSIONS)) if name not in TEMPLATES]
    emulated = sorted(
        glob.glob(os.path.join(EMULATION, "bin", "*")) + glob.glob(os.path.join(EMULATION, "lib", "*.sh"))
    )
    assert {os.path.basename(p) for p in helpers} == {
        "load_modules.sh",
        "mps.sh",
        "set_affinity_gpu_polaris.sh",
        "set_affinity_gpu_aurora.sh",
    }
    tools = [os.path.join(REPO, "tools", name) for name in ("layered_venv.sh", "setup_frontier.sh")]
    shellcheck([*helpers, *emulated, *tools])


def test_frontiers_setup_follows_olcfs_pytorch_guide_step_by_step(tmp_path):
    """tools/setup_frontier.sh with Lmod, conda and the environment's Python stood in for (each logs
    what it was asked): the modules of OLCF's guide, a Python 3.12 conda environment, torch and
    torchvision from the profile's ROCm wheel index, DeepSpeed, ROCm unloaded and mpi4py built with
    MPICC="cc -shared" --no-binary=mpi4py, the kit last (its torch already there); a module that does
    not load is one line, exit 2."""
    log = tmp_path / "log"
    shims = tmp_path / "shims.sh"
    shims.write_text(
        f'module() {{ echo "module $*" >> {log}; [[ "$2" != "${{FAIL_MODULE:-}}" ]]; }}\n'
        f'conda() {{ echo "conda $*" >> {log}; }}\n'
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\necho "python MPICC=${{MPICC:-}} $*" >> {log}\n')
    python.chmod(0o755)
    env = dict(os.environ, BASH_ENV=str(shims), PATH=f"{bin_dir}:{os.environ['PATH']}")
    script = os.path.join(REPO, "tools", "setup_frontier.sh")
    done = subprocess.run(["bash", script, str(tmp_path / "env")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = log.read_text().splitlines()
    index = load_site("frontier").pins["wheel index"]["value"]
    assert steps == [
        "module load PrgEnv-gnu/8.7.0",
        "module load cpe/26.03",
        "module load miniforge3/23.11.0-0",
        "module load rocm/7.1.1",
        "module load craype-accel-amd-gfx90a",
        f"conda create -y -p {tmp_path / 'env'} python=3.12 -c conda-forge",
        f"conda activate {tmp_path / 'env'}",
        "python MPICC= -m pip install --disable-pip-version-check torch==2.10.0 torchvision==0.25.0 "
        f"--index-url {index}",
        "python MPICC= -m pip install --disable-pip-version-check deepspeed",
        "module unload craype-accel-amd-gfx90a",
        "module unload rocm",
        "python MPICC=cc -shared -m pip install --disable-pip-version-check --no-cache-dir --no-binary=mpi4py mpi4py",
        f"python MPICC= -m pip install --disable-pip-version-check -e {REPO}",
    ]
    log.unlink()
    refused = subprocess.run(
        ["bash", script, str(tmp_path / "env")],
        env=dict(env, FAIL_MODULE="miniforge3/23.11.0-0"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stdout.strip().splitlines()[-1] == (
        "[setup-frontier] `module load miniforge3/23.11.0-0` failed; `module avail miniforge3` lists what "
        "Frontier has (set FRONTIER_MODULES)"
    )


@pytest.mark.parametrize("procs_per_gpu, expected", [("1", "3 2 1 0 3 2 1 0"), ("2", "3 3 2 2 1 1 0 0")])
def test_polaris_gpu_affinity_maps_local_ranks_in_reverse(procs_per_gpu, expected):
    seen = []
    for local_rank in range(8):
        env = dict(os.environ, GPUS_PER_NODE="4", PROCS_PER_GPU=procs_per_gpu, PMI_LOCAL_RANK=str(local_rank))
        result = subprocess.run(
            [os.path.join(SUBMISSIONS, "set_affinity_gpu_polaris.sh"), "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        seen.append(result.stdout.strip())
    assert " ".join(seen) == expected


def test_mps_helper_starts_waits_for_and_stops_the_daemon(tmp_path):
    # nvidia-cuda-mps-control is replaced by a recorder: what the helper asks of it, in which order.
    stub = tmp_path / "bin" / "nvidia-cuda-mps-control"
    stub.parent.mkdir()
    calls = tmp_path / "calls"
    stub.write_text(
        "#!/bin/bash\n"
        f'if [[ "${{1:-}}" == -d ]]; then echo "daemon $CUDA_MPS_PIPE_DIRECTORY" >> {calls}; '
        f"touch {tmp_path}/running; exit 0; fi\n"
        f'read -r command; [[ -e {tmp_path}/running ]] || exit 1; echo "$command" >> {calls}\n'
    )
    stub.chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{stub.parent}:{os.environ['PATH']}",
        CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"),
        CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "log"),
        SLURM_LOCALID="0",
    )
    helper = os.path.join(SUBMISSIONS, "mps.sh")
    wrapped = subprocess.run(
        [helper, "wrap", "sh", "-c", "echo rank ran >> " + str(calls)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrapped.returncode == 0, wrapped.stderr
    assert calls.read_text().splitlines() == [f"daemon {tmp_path / 'pipe'}", "get_server_list", "rank ran", "quit"]
    assert (tmp_path / "pipe").is_dir() and (tmp_path / "log").is_dir()
    missing = subprocess.run(
        [helper, "start"], env={**env, "CUDA_MPS_PIPE_DIRECTORY": ""}, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode != 0 and "CUDA_MPS_PIPE_DIRECTORY" in missing.stderr


# -- Slurm: a real slurmctld and slurmd ------------------------------------------------------------

PREEMPT_GRACE_S = 90


class PreemptingSlurmCluster(SlurmCluster):
    """The test cluster with two more partitions on its node: a job in `high` preempts one in `low`,
    which gets SIGTERM and PREEMPT_GRACE_S seconds before SIGKILL (Perlmutter's preempt QOS works
    alike). `debug`, the default, is never preempted."""

    def _write_conf(self) -> None:
        super()._write_conf()
        with open(self.conf) as handle:
            text = handle.read().replace("PartitionName=debug ", "PartitionName=debug PriorityTier=1 PreemptMode=OFF ")
        text += (
            f"PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n"
            f"PartitionName=low Nodes={self.host} PriorityTier=1 PreemptMode=CANCEL GraceTime={PREEMPT_GRACE_S} "
            f"MaxTime=INFINITE State=UP OverSubscribe=NO\n"
            f"PartitionName=high Nodes={self.host} PriorityTier=2 PreemptMode=OFF MaxTime=INFINITE State=UP "
            f"OverSubscribe=NO\n"
        )
        with open(self.conf, "w") as handle:
            handle.write(text)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    try:
        check_installed()
    except SlurmUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    cluster = PreemptingSlurmCluster(str(tmp_path_factory.mktemp("slurm"))).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def sbatch(
    cluster: SlurmClient, arguments: Sequence[str], settings: dict[str, str], cwd: str, timeout: float = 60
) -> subprocess.CompletedProcess:
    """`sbatch ARGUMENTS` from `cwd` with the settings in the environment it passes to the job."""
    return cluster.run(["sbatch", *arguments], env={"KIT_DIR": REPO, **settings}, cwd=cwd, timeout=timeout)


def slurm_job_field(cluster: SlurmClient, job_id: str, name: str) -> str:
    shown = cluster.run(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
    return next((field.split("=", 1)[1] for field in shown.split() if field.startswith(f"{name}=")), "")


def wait_for_slurm_state(cluster: SlurmClient, job_id: str, wanted: str) -> None:
    def state() -> str:
        return slurm_job_field(cluster, job_id, "JobState")

    wait_for(lambda: state() == wanted, 60, f"Slurm job {job_id} {wanted}", state)


SLURM_END_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}


def run_slurm_job(
    cluster: SlurmClient, arguments: Sequence[str], settings: dict[str, str], cwd: str, timeout: float = JOB_TIMEOUT_S
) -> int:
    """Submit a batch job, wait until it has ended and return its exit status. Polled here rather than
    with `sbatch --wait`, which sleeps up to 32 s between its own polls."""
    submitted = sbatch(cluster, ["--parsable", *arguments], settings, cwd)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait_for(
        lambda: slurm_job_field(cluster, job, "JobState") in SLURM_END_STATES,
        timeout,
        f"Slurm job {job} ending",
        lambda: job_outputs(cwd),
    )
    return int(slurm_job_field(cluster, job, "ExitCode").split(":")[0])


@pytest.mark.slow
def test_slurm_cpu_template_runs_the_study_into_one_job_directory(slurm, tmp_path):
    job_dir = str(tmp_path / "study")
    settings = dict(STUDY, BACKENDS="ddp horovod", JOB_DIR=job_dir)
    started = time.monotonic()
    status = run_slurm_job(slurm, ["--output", str(tmp_path / "%j.out"), SLURM_CPU], settings, str(tmp_path))
    elapsed = time.monotonic() - started
    assert status == 0, job_outputs(str(tmp_path))
    records = assert_job_directory(job_dir, ["ddp", "horovod"], [1, 2], launcher="slurm", launch_word="srun")
    # The job moved its output file from where it was submitted into its directory.
    assert glob.glob(str(tmp_path / "*.out")) == []
    assert "study complete" in "".join(read_text(p) for p in glob.glob(os.path.join(job_dir, "*.out")))
    assert all(r["steps"] == 12 for r in records)
    # Notebook 03 reads the job's directory and draws a per-rank timeline from its multi-rank runs.
    assert all(r["timeline"]["per_rank"] for r in records if r["world_size"] > 1)
    print(f"\nsbatch slurm-cpu.sbatch: submission to figures and report in {elapsed:.0f} s (4 runs)")


@pytest.mark.slow
def test_slurm_preemption_checkpoints_resubmits_and_ends_with_uninterrupted_weights(slurm, tmp_path):
    job_dir = str(tmp_path / "preempted")
    model = os.path.join(job_dir, "model.pt")
    settings = dict(
        PREEMPTED_STUDY, BACKENDS="ddp", JOB_DIR=job_dir, TRAIN_ARGS=f"{QUICK_TRAIN_ARGS} --save-model {model}"
    )
    submitted = sbatch(slurm, ["--parsable", "--output", str(tmp_path / "%j.out"), SLURM_CPU], settings, str(tmp_path))
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip().split(";")[0]
    run_dir = os.path.join(job_dir, "checkpoints", "ddp-2r-rep0")
    wait_for(lambda: has_checkpoint(run_dir), 300, "the run's first checkpoint", lambda: job_outputs(str(tmp_path)))
    # What `#SBATCH --signal=B:USR1@120` does before the time limit: signal the batch shell only.
    signalled = subprocess.run(
        ["scancel", "--signal=USR1", "--batch", first_job],
        env=slurm.environ(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert signalled.returncode == 0, signalled.stderr
    wait_for(
        lambda: any(event[2] == "study complete" for event in job_events(job_dir)),
        JOB_TIMEOUT_S,
        "the resubmitted job finishing the study",
        lambda: job_outputs(str(tmp_path)) + read_text(os.path.join(job_dir, "jobs.txt")),
    )

    events = job_events(job_dir)
    resubmitted = [event[2].split()[-1] for event in events if event[2].startswith("resubmitted as ")]
    assert len(resubmitted) == 1 and resubmitted[0] != first_job
    second_job = resubmitted[0]
    assert [e[2] for e in events if e[1] == first_job][1:] == [
        "signal USR1",
        "end: sweep status 3",
        f"resubmitted as {second_job}",
    ]
    assert [e[2] for e in events if e[1] == second_job][-2:] == ["end: sweep status 0", "study complete"]
    assert "study complete" in read_text(os.path.join(job_dir, f"harness-scaling-cpu-{second_job}.out"))
    for job in (first_job, second_job):  # the preempted job did its part: checkpointed and resubmitted
        wait_for_slurm_state(slurm, job, "COMPLETED")
        assert slurm_job_field(slurm, job, "ExitCode") == "0:0"

    log = read_text(os.path.join(job_dir, "logs", "001-ddp-2r-rep0.log"))
    stopped = [line for line in log.splitlines() if "stopped by SIGUSR1 after step" in line]
    assert len(stopped) == 1, log[-3000:]
    checkpoint_step = int(stopped[0].split("after step ")[1].split()[0])
    assert 5 <= checkpoint_step < PREEMPTED_STEPS
    (record,) = read_records([os.path.join(job_dir, "results.jsonl")])
    assert (record["segments"], record["resumed_from_step"], record["steps"]) == (2, checkpoint_step, PREEMPTED_STEPS)

    difference = difference_from_uninterrupted(job_dir, "ddp-2r-rep0", 2, model, str(tmp_path))
    assert difference <= 1e-6
    print(
        f"\npreempted job {first_job}: checkpoint at step {checkpoint_step} of {PREEMPTED_STEPS}, resubmitted as job "
        f"{second_job}, which finished; max |w - w_uninterrupted| = {difference:.3g}"
    )


@pytest.mark.slow
def test_a_preempted_slurm_job_continues_the_study_in_a_new_job(slurm, tmp_path):
    # A job in `high` takes the node: Slurm sends the study's run SIGTERM and gives it a grace time.
    # The run checkpoints; the job reads PreemptTime from its record and resubmits itself to `low`.
    job_dir = str(tmp_path / "preempted")
    settings = dict(PREEMPTED_STUDY, BACKENDS="ddp", JOB_DIR=job_dir, STEPS="60")
    submitted = sbatch(
        slurm,
        ["--parsable", "--partition=low", "--output", str(tmp_path / "%j.out"), SLURM_CPU],
        settings,
        str(tmp_path),
    )
    assert submitted.returncode == 0, submitted.stderr
    first_job = submitted.stdout.strip().split(";")[0]
    wait_for(
        lambda: has_checkpoint(os.path.join(job_dir, "checkpoints", "ddp-2r-rep0")),
        300,
        "the run's first checkpoint",
        lambda: job_outputs(str(tmp_path)),
    )
    urgent = sbatch(
        slurm,
        [
            "--parsable",
            "--partition=high",
            "--ntasks=2",
            "--output",
            str(tmp_path / "urgent.log"),
            "--wrap",
            "sleep 5",
        ],
        {},
        str(tmp_path),
    )
    assert urgent.returncode == 0, urgent.stderr
    wait_for(
        lambda: any(event[2] == "study complete" for event in job_events(job_dir)),
        JOB_TIMEOUT_S,
        "the continuation finishing the study",
        lambda: job_outputs(str(tmp_path)) + read_text(os.path.join(job_dir, "jobs.txt")),
    )
    first = [e[2] for e in job_events(job_dir) if e[1] == first_job]
    resubmitted = [event.split()[-1] for event in first if event.startswith("resubmitted as ")]
    assert "end: sweep status 3" in first and len(resubmitted) == 1, first
    assert "preempted after a checkpoint; continues as job" in read_text(os.path.join(job_dir, f"{first_job}.out"))
    assert slurm_job_field(slurm, resubmitted[0], "Partition") == "low"
    assert "stopped by SIGTERM after step" in read_text(os.path.join(job_dir, "logs", "001-ddp-2r-rep0.log"))
    (record,) = read_records([os.path.join(job_dir, "results.jsonl")])
    assert record["segments"] == 2 and record["steps"] == 60


@pytest.mark.slow
def test_a_cancelled_perlmutter_job_checkpoints_and_does_not_come_back(slurm, tmp_path):
    # The GPU template on this GPU-less node, its #SBATCH resources overridden on the command line
    # as on any cluster: discovery and one srun step per run. scancel sends SIGTERM, not the USR1
    # warning: the run checkpoints, and the chain stops there.
    job_dir = str(tmp_path / "cancelled")
    settings = dict(
        STUDY,
        BACKENDS="ddp",
        RANKS="2",
        RANKS_PER_NODE="2",
        GPUS_PER_NODE="0",
        STEPS="100000",
        CHECKPOINT_EVERY="5",
        JOB_DIR=job_dir,
    )
    submitted = sbatch(
        slurm,
        [
            "--parsable",
            "--output",
            str(tmp_path / "%j.out"),
            "--nodes=1",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            "--gpus-per-node=0",
            PERLMUTTER,
        ],
        settings,
        str(tmp_path),
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    wait_for(
        lambda: has_checkpoint(os.path.join(job_dir, "checkpoints", "ddp-2r-rep0")),
        300,
        "the run's first checkpoint",
        lambda: job_outputs(str(tmp_path)),
    )
    cancelled = subprocess.run(["scancel", job], env=slurm.environ(), capture_output=True, text=True, timeout=30)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for_slurm_state(slurm, job, "CANCELLED")
    assert [e[2] for e in job_events(job_dir)][1:] == ["signal TERM", "end: sweep status 3"]
    assert "stopped by SIGTERM after step" in read_text(os.path.join(job_dir, "logs", "001-ddp-2r-rep0.log"))
    assert "not resubmitting" in read_text(os.path.join(job_dir, f"{job}.out"))
    queued = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=slurm.environ(), capture_output=True, text=True, timeout=30
    )
    assert queued.stdout.split() == []
    discovery = [json.loads(line) for line in read_text(os.path.join(job_dir, f"discovery-{job}.jsonl")).splitlines()]
    assert sorted((d["launcher"], d["rank"], d["world_size"]) for d in discovery) == [("slurm", 0, 2), ("slurm", 1, 2)]
    (run,) = [
        shlex.split(line)
        for line in read_text(os.path.join(job_dir, "logs", "commands.txt")).splitlines()
        if " -m harness train " in line
    ]
    assert run[: run.index("-m") - 1] == [
        "srun",
        "--nodes",
        "1",
        "--ntasks",
        "2",
        "--ntasks-per-node",
        "2",
        "--cpus-per-task",
        "1",
        "--cpu-bind",
        "cores",
    ], run


def train_flags_without_outputs(command: Sequence[str]) -> list[str]:
    """A recorded `harness train` command's flags, less --backend and what only names outputs."""
    flags = list(command[list(command).index("train") + 1 :])
    dropped = {"--backend", "--results", "--tag", "--checkpoint-dir", "--resume", "--save-model", "--checkpoint-every"}
    kept = []
    while flags:
        flag = flags.pop(0)
        if flag in dropped:
            flags.pop(0)
        else:
            kept.append(flag)
    return kept


def difference_from_uninterrupted(job_dir: str, run_key: str, ranks: int, model: str, scratch: str) -> float:
    """max |w - w'| between `model` and the weights of the same run uninterrupted: the run `run_key`
    (e.g. ddp-2r-rep0) as the sweep recorded it, launched here on `ranks` local processes. The
    reference costs as much as the run: one an earlier test left in `scratch` for the same flags is reused."""
    commands = [
        shlex.split(line)
        for line in read_text(os.path.join(job_dir, "logs", "commands.txt")).splitlines()
        if " -m harness train " in line
    ]
    command = next(c for c in commands if os.path.basename(c[c.index("--checkpoint-dir") + 1]) == run_key)
    flags = train_flags_without_outputs(command)
    digest = hashlib.sha256(shlex.join([str(ranks), run_key, *flags]).encode()).hexdigest()[:12]
    reference = os.path.join(scratch, f"uninterrupted-{run_key}-{digest}.pt")
    if not os.path.exists(reference):
        launch(ranks, run_key.split("-")[0], [*flags, "--save-model", reference + ".partial"])
        os.replace(reference + ".partial", reference)  # only a complete file is ever reused
    return max_abs_difference(load_weights(model), load_weights(reference))


def test_bad_settings_stop_the_job_before_anything_runs(slurm, tmp_path):
    job_dir = tmp_path / "bad"
    status = run_slurm_job(
        slurm,
        ["--output", str(tmp_path / "bad.out"), SLURM_CPU],
        dict(STUDY, BACKENDS="ddp dpp", JOB_DIR=str(job_dir)),
        str(tmp_path),
        timeout=120,
    )
    assert status == 2
    errors = [line for line in read_text(str(tmp_path / "bad.out")).splitlines() if "error" in line]
    assert errors == [
        "harness study: error: backend dpp: unknown backend 'dpp'; choose one of none, ddp, horovod, deepspeed, fsdp"
    ]
    assert not job_dir.exists()
