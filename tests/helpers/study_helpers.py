"""A StudyJob built by hand, for the study tests that need one without a scheduler."""

from __future__ import annotations

import os
from typing import Optional

from harness.study.jobs.jobdir import StudyJob
from harness.study.jobs.scheduler import Allocation, JobRecord
from harness.study.jobs.settings import resolve_settings
from harness.study.sites import load_site
from tests.conftest import REPO


def make_job(
    site: str,
    job_dir: str,
    values: Optional[dict[str, str]] = None,
    record: Optional[JobRecord] = None,
    nodes: int = 1,
    gpus: int = 0,
    script: Optional[str] = None,
) -> StudyJob:
    """A job of `site` on `nodes` nodes with `gpus` GPUs each, its settings resolved from `values`."""
    profile = load_site(site)
    settings = resolve_settings(
        profile, {"JOB_DIR": job_dir, **(values or {})}, Allocation(nodes=nodes, tasks_per_node=2), gpus, job_dir
    )
    os.makedirs(os.path.join(job_dir, "logs"), exist_ok=True)
    return StudyJob(
        profile,
        "123.server",
        record or JobRecord("123.server"),
        Allocation(nodes=nodes),
        settings,
        REPO,
        script,
        resumed=False,
    )
