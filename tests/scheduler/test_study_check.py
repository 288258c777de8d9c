"""The study check through the job templates themselves (bash running the template's --check and --submit)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import REPO
from tests.unit.test_study_check import AURORA, FRONTIER, PLUGINS, POLARIS


def test_horovod_missing_from_polaris_conda_is_refused_before_anything_is_queued(tmp_path):
    # ALCF's conda has no Horovod: a package that cannot be imported stands in for it, and a qsub
    # that records its calls shows that nothing was submitted. The check runs through the template,
    # as on the login node: its module/conda lines (no-ops here), then `harness study --submit`.
    shims = tmp_path / "site-shell"
    shims.write_text("module() { :; }\nconda() { :; }\n")
    fake = tmp_path / "site-packages" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'horovod'\")\n")
    calls = tmp_path / "qsub-calls"
    qsub = tmp_path / "bin" / "qsub"
    qsub.parent.mkdir()
    qsub.write_text(f'#!/bin/bash\necho "$@" >> {calls}\necho 1.fake\n')
    qsub.chmod(0o755)
    env = dict(
        os.environ,
        BASH_ENV=str(shims),
        PYTHONPATH=str(fake.parent),
        PYTHON_ENV="venv",
        VENV=os.path.join(REPO, ".venv"),
        PATH=f"{qsub.parent}:{os.environ['PATH']}",
        **PLUGINS,
    )
    result = subprocess.run(
        ["bash", POLARIS, "--submit", "--", "-A", "DLscaling", "-v", "BACKENDS=ddp horovod"],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("harness study: error:")]
    assert (
        len(errors) == 1 and "backend horovod: horovod.torch cannot be loaded (No module named 'horovod')" in errors[0]
    )
    assert "on polaris: ALCF's conda module has no Horovod since 2025-10" in errors[0]
    assert "submit with -v PYTHON_ENV=venv" in errors[0]
    assert not calls.exists(), "qsub must not run when the check fails"
    passed = subprocess.run(
        ["bash", POLARIS, "--submit", "--", "-A", "DLscaling"],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert passed.returncode == 0 and passed.stdout.strip().splitlines()[-1] == "1.fake", passed.stderr
    assert calls.read_text().split() == ["-A", "DLscaling", POLARIS]


@pytest.mark.parametrize(
    "template, args",
    # run from tmp_path: -v KIT_DIR names the kit, as a qsub from outside it must (preflight)
    [(AURORA, ["-A", "p", "-v", f"BACKENDS=ddp horovod,RESUBMIT=0,KIT_DIR={REPO}"]), (FRONTIER, ["-A", "p"])],
    ids=["aurora", "frontier"],
)
def test_a_backend_the_site_lacks_is_refused_through_the_template_in_one_line(template, args, tmp_path):
    # Through the template, as on the login node: its module lines (no-ops here), the kit's venv
    # standing in for the site's Python. Horovod is refused on Aurora whatever this Python has;
    # Frontier's needs RCCL, which this machine's CPU build lacks.
    shims = tmp_path / "site-shell"
    shims.write_text("module() { :; }\nconda() { :; }\n")
    env = dict(
        os.environ,
        BASH_ENV=str(shims),
        PYTHON_ENV="venv",
        VENV=os.path.join(REPO, ".venv"),
        BACKENDS="horovod",
        **PLUGINS,
    )
    result = subprocess.run(
        ["bash", template, "--check", "--", *args],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("harness study: error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stdout + result.stderr
    if template == AURORA:
        assert errors[0] == (
            "harness study: error: backend horovod is not supported on aurora: Horovod does not run "
            "on Aurora's XPUs (ALCF removed it from the frameworks module in spring 2026); compare "
            'ddp, deepspeed and fsdp: -v BACKENDS="ddp deepspeed fsdp"'
        )
    else:
        assert errors[0].startswith("harness study: error: backend horovod is built without nccl")
        assert "HOROVOD_GPU=ROCM HOROVOD_GPU_OPERATIONS=NCCL bash tools/build_horovod.sh" in errors[0]
