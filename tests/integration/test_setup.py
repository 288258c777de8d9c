"""Setup's tools run for real: pip's resolver on the torch pair, shellcheck on the scripts."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import zipfile
from pathlib import Path
from typing import Optional

import pytest

from tests.conftest import REPO
from tests.unit.test_setup import install_torch

# (name, version, requirement of torchvision on torch)
RELEASES = [
    ("torch", "2.14.1", None),
    ("torch", "2.15.0", None),
    ("torchvision", "0.29.1", "torch==2.14.1"),
    ("torchvision", "0.30.0", "torch==2.15.0"),
]


def _wheel(directory: Path, name: str, version: str, requires: Optional[str]) -> None:
    """A minimal valid wheel: metadata only."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: {}\nVersion: {}\n{}".format(
            name, version, f"Requires-Dist: {requires}\n" if requires else ""
        ),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for path, text in {**files, f"{dist}/RECORD": "\n".join(record) + "\n"}.items():
            archive.writestr(path, text)


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("wheels")
    for name, version, requires in RELEASES:
        _wheel(directory, name, version, requires)
    return directory


def _resolve(
    index: Path, tmp_path: Path, monkeypatch, environ: dict[str, str], constraint: Optional[str], capsys
) -> tuple:
    """Run install_torch's request through real pip, offline, dry; (status, {name: version}, stderr)."""
    report = tmp_path / "report.json"
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's own constraints stay out of it
    for name in ("PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    if constraint:
        (tmp_path / "constraints.txt").write_text(constraint + "\n")
        monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "constraints.txt"))
    ranges = install_torch.supported_ranges((Path(REPO) / "pyproject.toml").read_text())
    requested = install_torch.requirements(ranges, environ)
    status = install_torch.install(
        requested,
        str(tmp_path / "pip.log"),
        ["--dry-run", "--ignore-installed", "--no-index", "--find-links", str(index), "--report", str(report)],
    )
    chosen = {}
    if status == 0:
        chosen = {
            item["metadata"]["name"]: item["metadata"]["version"] for item in json.loads(report.read_text())["install"]
        }
    return status, chosen, capsys.readouterr().err


@pytest.mark.parametrize(
    "constraint, expected",
    [
        (None, {"torch": "2.15.0", "torchvision": "0.30.0"}),
        ("torchvision<=0.29.1", {"torch": "2.14.1", "torchvision": "0.29.1"}),  # the cap seen on a fresh machine
        ("torch<2.15", {"torch": "2.14.1", "torchvision": "0.29.1"}),
    ],
)
def test_pip_picks_a_pair_that_fits_the_sites_constraints(index, tmp_path, monkeypatch, capsys, constraint, expected):
    status, chosen, stderr = _resolve(index, tmp_path, monkeypatch, {}, constraint, capsys)
    assert status == 0, stderr + (tmp_path / "pip.log").read_text()
    assert chosen == expected


def test_an_impossible_request_is_one_line_naming_the_conflict_and_the_fix(index, tmp_path, monkeypatch, capsys):
    status, _, stderr = _resolve(
        index, tmp_path, monkeypatch, {"TORCHVISION_SPEC": "torchvision==0.30.0"}, "torchvision<=0.29.1", capsys
    )
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith("[setup] error: pip cannot install")
    assert "torchvision==0.30.0" in line and "(constraint) torchvision<=0.29.1" in line
    assert "TORCH_SPEC" in line and "TORCHVISION_SPEC" in line and "pip config list" in line


def test_a_missing_release_is_one_line_too(index, tmp_path, monkeypatch, capsys):
    status, _, stderr = _resolve(index, tmp_path, monkeypatch, {"TORCH_SPEC": "torch==9.9"}, None, capsys)
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert "no release of torch==9.9 is available to pip here" in line


def test_the_setup_scripts_pass_shellcheck():
    scripts = [
        os.path.join(REPO, "tools", name) for name in os.listdir(os.path.join(REPO, "tools")) if name.endswith(".sh")
    ]
    result = subprocess.run(["shellcheck", *scripts], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
