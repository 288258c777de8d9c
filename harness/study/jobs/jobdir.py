"""One job of a study and its directory, JOB_DIR: what the job was given, and its event log."""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass
from typing import Optional

from ..sites import SiteProfile
from .scheduler import Allocation, JobRecord
from .settings import StudySettings

EVENTS_FILE = "jobs.txt"


def say(message: str) -> None:
    """A progress line in the job's output."""
    print(f"[job {time.strftime('%Y-%m-%d %H:%M:%S')}] {message}", flush=True)


@dataclass
class StudyJob:
    """One job of a study: where it runs, what it was given, and what it runs."""

    profile: SiteProfile
    job_id: str
    record: JobRecord
    allocation: Allocation
    settings: StudySettings
    kit_dir: str
    script: Optional[str]  # the job script as submitted: what a continuation submits again
    resumed: bool  # JOB_DIR held this study's settings already

    @property
    def number(self) -> str:
        return self.job_id.split(".")[0]

    def path(self, *parts: str) -> str:
        return os.path.join(self.settings.job_dir, *parts)

    def note(self, event: str) -> None:
        """One line in jobs.txt: time, job id, event."""
        with open(self.path(EVENTS_FILE), "a") as handle:
            handle.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}\t{self.job_id}\t{event}\n")

    def log_command(self, what: str, command: list[str]) -> None:
        """A command the job ran, in logs/commands.txt beside the runs' (harness.study.scaling.sweep)."""
        with open(self.path("logs", "commands.txt"), "a") as handle:
            handle.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{shlex.join(command)}\n")

    def events(self) -> list[str]:
        """The events jobs.txt holds so far, every job of the chain's."""
        path = self.path(EVENTS_FILE)
        if not os.path.exists(path):
            return []
        with open(path) as handle:
            return [line.rstrip("\n").split("\t", 2)[-1] for line in handle]
