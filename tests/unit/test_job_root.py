"""A job's directory defaults to its site's scratch file system (the profile's `job_root`: Eagle and
Flare's project directories at ALCF, $SCRATCH at NERSC, Orion at OLCF), the kit's runs/ where the
site or the job cannot say which; job data under $HOME is warned of, at a site and off one."""

from __future__ import annotations

import os

import pytest

from harness.study.jobs.check import CheckResult, check_storage
from harness.study.jobs.preflight import check_study
from harness.study.jobs.settings import default_job_dir, home_warning
from harness.study.sites import load_site, profile_from_dict
from tests.conftest import REPO

ENVIRON = {"USER": "ada", "SCRATCH": "/pscratch/sd/a/ada"}
KIT = "/kit"


@pytest.mark.parametrize(
    "site, expected",
    [
        ("polaris", "/lus/eagle/projects/DLscaling/ada/harness-runs/polaris-42"),
        ("aurora", "/lus/flare/projects/DLscaling/ada/harness-runs/aurora-42"),
        ("perlmutter", "/pscratch/sd/a/ada/harness-runs/perlmutter-42"),
        ("frontier", "/lustre/orion/dlscaling/scratch/ada/harness-runs/frontier-42"),  # OLCF's ids are lower case
        ("generic-slurm", "/kit/runs/generic-slurm-42"),
    ],
)
def test_each_site_puts_a_job_on_its_scratch_file_system(site, expected):
    profile = load_site(site)
    assert default_job_dir(profile, KIT, site, "42", "DLscaling", ENVIRON) == expected
    if profile.job_root:
        assert profile.job_root["source"]  # the guide the path comes from
        assert profile.storage_for(expected, ENVIRON).warn is None  # a file system meant for job data


def test_without_the_account_or_variable_the_path_needs_the_kit_keeps_the_job():
    assert default_job_dir(load_site("polaris"), KIT, "polaris", "42", None, ENVIRON) == "/kit/runs/polaris-42"
    assert default_job_dir(load_site("perlmutter"), KIT, "p", "42", None, {"USER": "ada"}) == "/kit/runs/p-42"


def test_a_profile_job_root_is_filled_from_the_account_and_variables():
    profile = profile_from_dict(
        {**_minimal(), "job_root": {"path": "/fs/{account_lower}/$USER", "source": "a guide"}}, "test"
    )
    assert profile.scratch_root("ABC", {"USER": "u"}) == "/fs/abc/u"
    assert profile.scratch_root("ABC", {}) is None


def test_job_data_under_home_is_warned_of_naming_the_sites_scratch(tmp_path):
    home = str(tmp_path / "home")
    environ = {"HOME": home}
    line = home_warning("JOB_DIR", os.path.join(home, "runs"), load_site("generic-pbs"), environ)
    assert line and "under $HOME" in line and "scratch or project file system" in line
    assert home_warning("JOB_DIR", str(tmp_path / "elsewhere"), None, environ) is None
    result = CheckResult()
    check_storage(load_site("polaris"), {"JOB_DIR": os.path.join(home, "x")}, "home:eagle", environ, result)
    assert any("/lus/eagle/projects/{account}" in warning for warning in result.warnings), result.warnings


def test_check_of_the_polaris_template_lands_on_eagle_without_a_warning():
    environ = {"USER": "ada", "LD_LIBRARY_PATH": os.path.join(REPO, "tests", "data", "site_plugins")}
    script = os.path.join(REPO, "submissions", "polaris.sc")
    result, _ = check_study("polaris", script, ["-A", "DLscaling", "-v", "BACKENDS=ddp"], environ=environ)
    assert result.ok and result.warnings == [], result
    # -l filesystems without eagle: the job directory's default file system is named as missing
    result, _ = check_study(
        "polaris", script, ["-A", "DLscaling", "-l", "filesystems=home", "-v", "BACKENDS=ddp"], environ=environ
    )
    assert any("JOB_DIR=/lus/eagle/projects/DLscaling/ada/harness-runs" in p for p in result.problems), result


def _minimal() -> dict:
    profile = load_site("generic-slurm")
    return {
        "name": "test",
        "description": "a test site",
        "scheduler": "slurm",
        "gpus_per_node": 0,
        "cores_per_node": None,
        "launch": profile.launch,
        "gpu_order": "natural",
        "warning": "signal",
        "software": "",
        "queue_field": "partition",
    }
