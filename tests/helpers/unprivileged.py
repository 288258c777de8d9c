"""Directory permissions that hold when the tests run as root (CI does), in-process.

Root passes every permission check (CAP_DAC_OVERRIDE), so a test that chmods a directory 0o555 to see
the harness refuse to write there proves nothing as root. `as_unprivileged_user()` makes the kernel
check the modes again for a short while: while this process is root, it sets the real and effective
uid and gid to nobody's (65534), keeping 0 as the saved ids, and puts them back afterwards. The real
ids change too because os.access() answers for the real uid; the saved 0 is what allows the way back
(no process is started, so it suits tests/unit/). Not root: it changes nothing, the modes already apply.
Whatever the body opens must be reachable by nobody: a module imported for the first time inside it
fails where the interpreter lives under /root (0o700), so the code under test is imported beforehand.

nobody needs search permission on every directory above the one a test locks, and pytest's tmp_path
lies under /tmp/pytest-of-root (0o700): `searchable_tmp_dir()` makes a directory that it can reach.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

NOBODY = 65534
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4


@contextlib.contextmanager
def searchable_tmp_dir() -> Iterator[Path]:
    """A new empty directory that any user may search (0o711, in the system's temporary directory,
    whose sticky 0o1777 lets everyone through); removed afterwards."""
    parent = tempfile.gettempdir()
    assert os.stat(parent).st_mode & stat.S_IXOTH, f"{parent} must be searchable by every user"
    path = Path(tempfile.mkdtemp(prefix="harness-unprivileged-", dir=parent))
    try:
        path.chmod(0o711)
        yield path
    finally:
        for root, names, _ in os.walk(path):  # a test's 0o555 directory would stop rmtree
            for name in names:
                os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(path)


@contextlib.contextmanager
def as_unprivileged_user() -> Iterator[None]:
    """Run the body as uid and gid 65534 without supplementary groups when this process is root; keep
    the body to the call under test (the whole process, pytest included, is nobody meanwhile)."""
    if os.geteuid() != 0:
        yield
        return
    uids, gids, groups = os.getresuid(), os.getresgid(), os.getgroups()
    libc = ctypes.CDLL(None, use_errno=True)
    dumpable = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    try:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, gids[2])
        os.setresuid(NOBODY, NOBODY, 0)
        yield
    finally:
        os.seteuid(0)  # the saved 0 allows it; then root may set every id back
        os.setresuid(*uids)
        os.setresgid(*gids)
        os.setgroups(groups)
        libc.prctl(_PR_SET_DUMPABLE, dumpable, 0, 0, 0)  # a change of uid cleared it (core dumps, /proc ownership)
