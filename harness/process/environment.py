"""The one way the harness changes environment variables for a while: `patched_environ`.

In the manner of Hugging Face accelerate's `patch_environment` (accelerate/utils/environment.py):
the variables are set or unset for a block and are exactly as before when it ends, an exception
included. A launcher's permanent change for the processes it starts is not made here: those few
places say why where they make it (tests/test_architecture.py lists them).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Optional


@contextlib.contextmanager
def patched_environ(
    changes: Optional[Mapping[str, Optional[str]]] = None, *, everything: bool = False
) -> Iterator[None]:
    """Within the block, the variables of `changes` are set (a string) or unset (None); on exit they
    are back as they were, set to their old values or unset. With `everything`, the whole
    environment is put back on exit, also the variables that the block itself set or unset
    (libraries do at import time)."""
    changes = dict(changes or {})
    saved = dict(os.environ) if everything else {name: os.environ.get(name) for name in changes}
    try:
        for name, value in changes.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        if everything:
            for name in set(os.environ) - set(saved):
                del os.environ[name]
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            elif os.environ.get(name) != value:
                os.environ[name] = value
