"""Install torch and torchvision as one pip request, resolved within the kit's supported range.

`make setup` runs this (standard library only: it runs before anything else is installed):

    python tools/install_torch.py            # install into the interpreter running it
    python tools/install_torch.py --print    # only print the requirement strings it would ask for

What it asks pip for: the ranges in pyproject.toml's `dependencies` (torch and torchvision), unless
TORCH_SPEC / TORCHVISION_SPEC name other requirements. Both go into one `pip install`, so pip picks a
*pair* that fits together and fits whatever the machine's pip configuration adds (constraints files
such as a site's `torchvision<=0.29.1`, local indexes, find-links). An exact pin here would break on
any site that caps one of them differently.

When pip cannot resolve, the user gets one line naming the conflicting requirements and the
variables that override them (exit status 2); pip's full output goes to a log file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from typing import Optional

PACKAGES = ("torch", "torchvision")
OVERRIDES = {"torch": "TORCH_SPEC", "torchvision": "TORCHVISION_SPEC"}
EXIT_USAGE = 2
# A requirement string inside pyproject.toml's dependency list, e.g. "torch>=2.5,<2.16".
_DEPENDENCY = re.compile(r'"\s*([A-Za-z0-9_.\-]+)\s*([<>=!~][^";#]*)?\s*"')


def supported_ranges(pyproject_text: str) -> dict[str, str]:
    """The requirement strings of torch and torchvision in pyproject.toml's `dependencies`."""
    block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", pyproject_text, re.S | re.M)
    if block is None:
        raise ValueError("pyproject.toml has no dependencies list")
    found = {}
    for name, spec in _DEPENDENCY.findall(block.group(1)):
        if name.lower() in PACKAGES:
            found[name.lower()] = name.lower() + (spec or "").replace(" ", "")
    missing = [name for name in PACKAGES if name not in found]
    if missing:
        raise ValueError(f"pyproject.toml's dependencies do not name {', '.join(missing)}")
    return found


def requirements(ranges: dict[str, str], environ: dict[str, str]) -> list[str]:
    """What to ask pip for: each package's TORCH_SPEC/TORCHVISION_SPEC if set, else the kit's range."""
    return [environ.get(OVERRIDES[name]) or ranges[name] for name in PACKAGES]


def explain_failure(pip_output: str, requested: Sequence[str]) -> str:
    """One line saying why pip could not install `requested`, and how to override it."""
    causes = []
    in_causes = False
    for line in pip_output.splitlines():
        stripped = line.strip()
        if stripped.startswith("The conflict is caused by"):
            in_causes = True
            continue
        if in_causes:
            if not stripped or stripped.startswith(("To fix", "Additionally")):
                in_causes = False
                continue
            causes.append(stripped)
    missing = re.search(r"No matching distribution found for (\S+)", pip_output)
    if causes:
        why = "; ".join(causes)
    elif missing:
        why = f"no release of {missing.group(1)} is available to pip here"
    else:
        last = [line.strip() for line in pip_output.splitlines() if line.strip().startswith("ERROR")]
        why = last[-1] if last else "pip failed"
    return (
        f"pip cannot install {' '.join(requested)} ({why}); set TORCH_SPEC and TORCHVISION_SPEC to a matching "
        "pair your pip configuration allows (e.g. TORCH_SPEC='torch==2.14.1' TORCHVISION_SPEC='torchvision==0.29.1'), "
        "or unset them so pip chooses within the kit's range; `pip config list` shows your site's constraints"
    )


def install(requested: Sequence[str], log_path: str, extra_args: Optional[Sequence[str]] = None) -> int:
    """pip install `requested` into this interpreter; on failure print one line and return 2."""
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *(extra_args or []), *requested]
    with open(log_path, "w") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
    if status == 0:
        return 0
    with open(log_path) as log:
        print(f"[setup] error: {explain_failure(log.read(), requested)} (pip's log: {log_path})", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str]) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(here, "pyproject.toml")) as handle:
        requested = requirements(supported_ranges(handle.read()), dict(os.environ))
    if "--print" in argv:
        print("\n".join(requested))
        return 0
    print(f"[setup] installing {' '.join(requested)} (pip resolves the pair within its configuration)", flush=True)
    log_path = os.path.join(os.path.dirname(sys.executable), "..", "pip-torch.log")
    return install(requested, os.path.normpath(log_path))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
