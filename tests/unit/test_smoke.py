"""`harness study --smoke`: the template's own request moved to the site's debug queue for 10 minutes,
DDP for 20 steps on every node; the check judges it as it judges the study; the job's result is
printed as the profile's verified_on, and a job that ends without one says where to look.
(The whole round trip through a real Slurm: tests/scheduler/test_workshop_queues_slurm.py.)"""

from __future__ import annotations

import json
import os

import pytest

from harness.errors import UsageError
from harness.study.jobs import smoke
from harness.study.jobs.preflight import check_study, smoke_arguments
from harness.study.jobs.submit import parse_submission
from harness.study.sites import load_site
from tests.conftest import REPO
from tests.helpers.study_helpers import make_job
from tests.unit.test_study_check import FRONTIER, PERLMUTTER, PLUGINS, POLARIS

SMOKE = {"BACKENDS": "ddp", "STEPS": "20", "REPEATS": "1", "RANKS": "", "RESUBMIT": "0", "SMOKE": "1"}


def test_polaris_smoke_goes_to_debug_with_the_requests_own_settings_under_its_own(tmp_path):
    args = ["-A", "DLscaling", "-v", 'BACKENDS=ddp horovod,PYTHON_ENV=venv,NOTE="first, then"']
    smoked, environ = smoke_arguments("polaris", POLARIS, args, dict(PLUGINS, USER="ada"), REPO)
    assert smoked[:8] == ["-A", "DLscaling", "-q", "debug", "-l", "walltime=00:10:00", "-N", "harness-smoke"]
    assert smoked[8] == "-v" and environ == dict(PLUGINS, USER="ada")
    submission = parse_submission("pbs", POLARIS, smoked, environ, "queue")
    assert (submission.queue, submission.walltime_s, submission.nodes) == ("debug", 600, 2)  # select=2: every node
    variables = submission.variables
    assert {name: variables[name] for name in SMOKE} == SMOKE and variables["NODES"] == "2"
    assert variables["PYTHON_ENV"] == "venv" and variables["NOTE"] == "first, then"  # kept, quoted comma and all
    # The study's default job directory on Eagle, for a smoke run of its own.
    assert os.path.basename(variables["JOB_DIR"]).startswith("smoke-")
    assert variables["JOB_DIR"].startswith("/lus/eagle/projects/DLscaling/ada/")
    # The check judges it as the real study: the debug queue takes 2 nodes for 10 minutes.
    result, _ = check_study("polaris", POLARIS, smoked, environ, REPO)
    assert result.ok, result


@pytest.mark.parametrize(
    "site, template, option",
    [("perlmutter", PERLMUTTER, "--qos=debug"), ("frontier", FRONTIER, "--qos=debug")],  # Frontier: QOS beside batch
)
def test_slurm_smoke_asks_for_the_debug_qos_and_passes_settings_in_the_environment(site, template, option):
    given = {"BACKENDS": "ddp fsdp", "JOB_DIR": "/scratch/smoke", **PLUGINS}
    smoked, environ = smoke_arguments(site, template, ["-A", "m1234", "-N", "2"], given, REPO)
    assert smoked == ["-A", "m1234", "-N", "2", option, "--time=00:10:00", "--job-name=harness-smoke"]
    assert {name: environ[name] for name in SMOKE} == SMOKE and environ["NODES"] == "2"
    assert environ["JOB_DIR"] == "/scratch/smoke"  # the request's own JOB_DIR
    submission = parse_submission("slurm", template, smoked, environ, load_site(site).queue_field)
    assert (submission.qos, submission.walltime_s) == ("debug", 600)


def test_the_job_writes_its_result_and_the_wait_prints_it(tmp_path, capsys):
    job = make_job("polaris", str(tmp_path), nodes=2, gpus=4)
    record = {"throughput": 5120.4, "world_size": 8, "versions": {"torch": "2.9.1", "python": "3.12.3"}}
    path = smoke.write_verification(job, 0, [record])
    written = json.loads(open(path).read())
    assert written["passed"] and written["nodes"] == 2 and written["job_id"] == job.job_id
    assert written["verified_on"].endswith(
        f": job {job.job_id}, 2 node(s) x 4 ranks, ddp 20 steps at 5120 samples/s; python 3.12.3, torch 2.9.1"
    )
    profile = load_site("polaris")
    assert smoke.wait_for_smoke(profile, job.job_id, job.settings.job_dir, {}, sleep=pytest.fail) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == f"smoke job passed: {written['verified_on']}"
    assert out[-1] == f'for harness/study/sites/polaris.json: "verified_on": {json.dumps(written["verified_on"])}'
    smoke.write_verification(job, 4, [])  # a rank died: failed, and said so
    assert smoke.wait_for_smoke(profile, job.job_id, job.settings.job_dir, {}, sleep=pytest.fail) == 1
    assert capsys.readouterr().err.strip() == (
        f"harness study: error: smoke job {job.job_id} failed (sweep status 4); see {job.path('logs')}"
    )


def test_a_smoke_job_that_ends_without_a_result_says_where_to_look(tmp_path, monkeypatch, capsys):
    def forgotten(*args, **kwargs):
        raise UsageError("qstat -fF json 7.pbs failed: Job has finished, use -x or -H to obtain historical job info")

    monkeypatch.setattr(smoke, "read_job", forgotten)
    pauses: list[float] = []
    status = smoke.wait_for_smoke(load_site("polaris"), "7.pbs", str(tmp_path), {}, poll_s=3, sleep=pauses.append)
    assert status == 1 and pauses == [3]  # one more look after the end, then the line
    assert capsys.readouterr().err.strip() == (
        f"harness study: error: smoke job 7.pbs ended without a result; read its output in {tmp_path} "
        "(or where it was submitted) and `harness study --check` the template"
    )
