"""The scheduler's job read through a qstat command (recorded output)."""

from __future__ import annotations

import os
import stat

from harness.study.jobs.scheduler import (
    read_pbs_job,
)
from tests.unit.test_study_scheduler import POLARIS_JOB, data


def test_the_job_is_read_from_json_never_from_wrapped_qstat_f(tmp_path, monkeypatch):
    # Plain `qstat -f` folds Submit_arguments over three lines: read line by line, the script and
    # the walltime are lost. The reader asks for JSON; this qstat answers -f with the wrapped text.
    wrapped = data("qstat_polaris_prod_f.txt")
    assert "-l wal\n\tltime=3:00:00" in wrapped and "\tpolaris.sc" in wrapped
    qstat = tmp_path / "qstat"
    (tmp_path / "f.txt").write_text(wrapped)
    (tmp_path / "json").write_text(data("qstat_polaris_prod.json"))
    qstat.write_text(
        f'#!/bin/bash\nif [[ "$1" == -fF && "$2" == json ]]; then cat {tmp_path}/json; else cat {tmp_path}/f.txt; fi\n'
    )
    qstat.chmod(qstat.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    record = read_pbs_job(POLARIS_JOB, {})
    assert record.script == "submissions/polaris.sc" and record.walltime_s == 3 * 3600
    assert ("-l", "walltime=3:00:00") in record.submit_options
