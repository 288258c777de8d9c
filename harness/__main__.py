"""`python -m harness` is the `harness` command.

Modules a site needs loaded before torch (HARNESS_IMPORT_FIRST, set by a study job from the site
profile: mpi4py on Polaris) are imported first, before anything here can import torch.
"""

import os
import sys

from .errors import EXIT_USAGE, UsageError
from .process.imports import import_first

try:
    import_first(os.environ)
except UsageError as exc:
    print(f"harness: error: {exc}", file=sys.stderr, flush=True)
    sys.exit(EXIT_USAGE)

from .cli import run_and_exit  # noqa: E402  (after the site's first imports, by design)

run_and_exit()
