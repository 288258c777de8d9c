"""`make setup` asks pip for torch and torchvision as one request within the kit's range, so a site's
pip constraints decide the pair; an impossible request is one line naming the fix.

Offline and real: pip resolves against a find-links folder of small wheels built here (a torch and
torchvision pair per release line, each torchvision pinning its torch as the real ones do), with
the machine's own pip configuration switched off and a constraints file of the test's own.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("install_torch", os.path.join(REPO, "tools", "install_torch.py"))
install_torch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(install_torch)


def test_the_request_is_the_supported_range_unless_overridden():
    ranges = install_torch.supported_ranges((Path(REPO) / "pyproject.toml").read_text())
    assert install_torch.requirements(ranges, {}) == [ranges["torch"], ranges["torchvision"]]
    assert all(">=" in spec and "<" in spec and "==" not in spec for spec in ranges.values())
    assert install_torch.requirements(ranges, {"TORCHVISION_SPEC": "torchvision==0.29.1"})[1] == "torchvision==0.29.1"


def test_the_horovod_cache_is_keyed_by_the_torch_that_is_installed():
    script = (Path(REPO) / "tools" / "build_horovod.sh").read_text()
    assert "torch.__version__" in script and "TORCH_SPEC" not in script
