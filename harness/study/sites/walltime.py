"""Walltimes as the batch systems write them, in seconds.

Slurm (`--time`, `TimeLimit=`): "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS", and
"UNLIMITED"/"INFINITE". PBS (`-l walltime=`): "[[HH:]MM:]SS", where a bare number is seconds, not
minutes. Reading "1-00:00:00" as anything but one day (cutting at the dash gave "1", one minute)
resubmitted a day-long job as a one-minute one.
"""

from __future__ import annotations

import re
from typing import Optional

from ...errors import UsageError

STYLES = ("slurm", "pbs")
UNLIMITED = ("UNLIMITED", "INFINITE")
_SLURM = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"
)
_PBS = re.compile(r"^(?:(?:(?P<h>\d+):)?(?P<m>\d+):)?(?P<s>\d+)$")


def parse_walltime(text: str, style: str) -> Optional[int]:
    """Seconds of a walltime written in `style` ("slurm" or "pbs"); None for an unlimited one."""
    value = str(text).strip()
    if style == "slurm":
        if value.upper() in UNLIMITED:
            return None
        match = _SLURM.match(value)
        if match:
            return _slurm_seconds(match)
        hint = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 1-00:00:00 for a day"
    elif style == "pbs":
        match = _PBS.match(value)
        if match:
            return int(match["h"] or 0) * 3600 + int(match["m"] or 0) * 60 + int(match["s"])
        hint = "HH:MM:SS, e.g. 01:00:00 for an hour"
    else:
        raise UsageError(f"unknown walltime style {style!r}; choose one of {', '.join(STYLES)}")
    raise UsageError(f"walltime {value!r} is not a {style} time limit; write {hint}")


def _slurm_seconds(match: re.Match[str]) -> int:
    if match["days"] is not None:  # D-HH[:MM[:SS]]
        return (
            int(match["days"]) * 86400 + int(match["dh"]) * 3600 + int(match["dm"] or 0) * 60 + int(match["ds"] or 0)
        )
    if match["c"] is not None:  # HH:MM:SS
        return int(match["a"]) * 3600 + int(match["b"]) * 60 + int(match["c"])
    return int(match["a"]) * 60 + int(match["b"] or 0)  # MM[:SS]


def format_walltime(seconds: Optional[int]) -> str:
    """HH:MM:SS (hours may exceed 24), as both batch systems read it; "UNLIMITED" for None."""
    if seconds is None:
        return "UNLIMITED"
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
