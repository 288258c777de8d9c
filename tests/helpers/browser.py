"""Headless Chromium under chromedriver (Debian's packages, driven by selenium) for the tests that
open a page in a real browser: a fresh profile each time, and the browser quit, or its process group
killed, however the test ends."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium_driver(
    chromium: str,
    chromedriver: str,
    profile: Path,
    page_s: float,
    stop_s: float = 20.0,
    flags: Sequence[str] = (),
    environ: Optional[Mapping[str, str]] = None,
    log: Optional[Path] = None,
) -> Iterator[Any]:
    """A selenium driver of `chromium`, its pages bounded by `page_s`; on exit quit() is given
    `stop_s` (it can hang on a wedged browser), then the driver's process group is killed."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    extra = {"env": dict(environ)} if environ is not None else {}
    service = Service(
        chromedriver, log_output=str(log) if log else None, popen_kw={"start_new_session": True}, **extra
    )
    driver = None
    try:
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(page_s)
        yield driver
    finally:
        if driver is not None:
            quitting = threading.Thread(target=driver.quit, daemon=True)
            quitting.start()
            quitting.join(stop_s)
        process = getattr(service, "process", None)
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
