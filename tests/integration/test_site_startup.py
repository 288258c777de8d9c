"""What happens before a study's Python starts, and first thing in every rank: a `module load` that
fails is named in one line (exit 2) by every template, and the modules a site needs before torch
(HARNESS_IMPORT_FIRST: mpi4py on Polaris) are imported before anything else of the harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(300)

# (template, the variable naming its modules, a module this site does not have)
TEMPLATES = [
    ("polaris.sc", None, "conda"),
    ("aurora.sc", "FRAMEWORKS_MODULE", "frameworks/1999.1.1"),
    ("frontier.sbatch", "SITE_MODULES", "rocm/0.0.1"),
    ("perlmutter.sbatch", "SITE_MODULES", "pytorch/0.0.1"),
    ("slurm-cpu.sbatch", "SITE_MODULES", "nccl-plugin"),
]


@pytest.mark.parametrize("template, variable, missing", TEMPLATES)
def test_a_module_that_does_not_load_is_named_in_one_line(template, variable, missing, tmp_path):
    # Lmod's `module` stands in as a shell function: `module load NAME` fails for the missing module.
    shims = tmp_path / "shims.sh"
    shims.write_text(
        f'module() {{ if [[ "$1" == load && "$2" == "{missing}" ]]; then echo "Lmod has detected an error" >&2; '
        "return 1; fi; return 0; }\nconda() { :; }\n"
    )
    env = dict(os.environ, BASH_ENV=str(shims), PYTHON_ENV="venv", VENV=os.path.join(REPO, ".venv"))
    if variable:
        env[variable] = missing
    result = subprocess.run(
        ["bash", os.path.join(REPO, "submissions", template), "--check", "--", "-A", "p"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.strip().splitlines() == [
        f"job: error: `module load {missing}` failed; `module avail {missing.split('/')[0]}` lists what this "
        "site has (set SITE_MODULES to choose)"
    ]


def test_the_sites_first_modules_are_imported_before_the_harness_and_torch(tmp_path):
    probe = tmp_path / "site_probe.py"
    probe.write_text(
        "import json, os, sys\n"
        "loaded = sorted(name for name in ('torch', 'harness.cli') if name in sys.modules)\n"
        "with open(os.environ['PROBE_OUT'], 'w') as out:\n"
        "    json.dump(loaded, out)\n"
    )
    out = tmp_path / "loaded.json"
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO}:{tmp_path}",
        HARNESS_IMPORT_FIRST="site_probe",
        PROBE_OUT=str(out),
    )
    result = subprocess.run(
        [sys.executable, "-m", "harness", "env"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == []  # nothing of torch or the harness's commands before it
    missing = subprocess.run(
        [sys.executable, "-m", "harness", "env"],
        env=dict(env, HARNESS_IMPORT_FIRST="no_such_site_module"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "no_such_site_module" in missing.stderr
