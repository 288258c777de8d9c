"""Stopping cleanly: preemption signals, and failing fast when a peer rank dies.

Preemption. Batch systems warn a job before they end it: Slurm sends the signal asked for with
`#SBATCH --signal=USR1@120` (or `scancel --signal=TERM`), PBS sends SIGTERM at the walltime and
SIGKILL `kill_delay` seconds later, and torchrun and the deepspeed launcher pass a SIGTERM they get
on to their ranks. On SIGTERM or SIGUSR1 the handler only records the signal. After every step the
ranks sum their flags in an allreduce of a single number, so all of them stop after the same step
even when the signal reached only some ranks, or reached them during different steps. Then a
checkpoint is written and the run exits with EXIT_PREEMPTED (3). The allreduce of a step's flags
runs in the background during the next step and is read after it, so the check adds no round trip
to a step (benchmarks/checkpoint.py measures it) and the ranks stop one step after the signal. On
a GPU the sum reaches the host through a side stream, so reading it waits for the step it
followed, never for the step queued behind it: the GPU's queue never runs dry at the check.

Peer failure. When a rank dies, the others find out in their next collective: at once when its
sockets are closed (a killed process), after --timeout seconds when it stops answering (a lost node,
a hung process): gloo and NCCL process groups (DeepSpeed's own groups included) and Horovod's gloo
controller all take the timeout (see the backends' init). The surviving ranks then print one line naming the problem and exit with
EXIT_PEER_FAILURE (4) at once, without the libraries' exit hooks, which could wait on the dead peer.

Testing hook (documented, real signals): HARNESS_TEST_SIGNAL=SIGNAL@STEP[:RANK] makes rank RANK
(default 0) send itself SIGNAL (TERM, USR1, KILL, ...) with os.kill right after global step STEP.
The tests use it to preempt or kill a rank at an exact step; the process really receives the
signal, so with KILL it dies as it would under the OOM killer.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..errors import PeerFailure, UsageError, first_line
from .signals import SignalCatcher, ignore_signals

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
VOTE_NAME = "harness.preemption_vote"
TEST_SIGNAL_VARIABLE = "HARNESS_TEST_SIGNAL"


class PreemptionWatcher:
    """Records SIGTERM/SIGUSR1 while installed; `stop_agreed` turns the records into one decision."""

    def __init__(self, test_signal: Optional[TestSignal] = None) -> None:
        self.test_signal = test_signal
        # Only recorded: the rank finishes its step, and stops where every rank agrees to.
        self._catcher = SignalCatcher(PREEMPTION_SIGNALS)
        self._vote: Optional[_Vote] = None  # the allreduce of the last step's flags

    @property
    def received(self) -> Optional[int]:
        """The first preemption signal this rank received while installed, or None."""
        return self._catcher.first

    def install(self) -> None:
        """Handle the preemption signals from now on (main thread only: Python delivers them there)."""
        self._catcher.install()

    def uninstall(self) -> None:
        """Give the signals back to the handlers they had before install."""
        self._catcher.restore()

    def stop_agreed(self, step: int, rank: int, backend, device: torch.device) -> bool:
        """After global step `step`: True on every rank if any rank had a preemption signal by the
        end of the previous step. A collective: every rank calls it after every step.

        The vote on this step's flags is only started here, and read after the next step: the
        allreduce overlaps that step's computation instead of adding a round trip to every step
        (Horovod's takes milliseconds). So the ranks stop one step after the signal.
        """
        if self.test_signal is not None:
            self.test_signal.fire(step, rank)
        previous, self._vote = self._vote, None
        if previous is not None and previous.read() > 0:
            return True
        # torch.full, not torch.tensor([...], device=...): a copy from the host would wait for the GPU.
        flags = torch.full((1,), 0.0 if self.received is None else 1.0, device=device)
        self._vote = _Vote(flags, backend.start_all_reduce_sum(flags, name=VOTE_NAME))
        return False

    def settle(self) -> None:
        """Wait for the vote in flight, so that no collective is left pending (end of training)."""
        if self._vote is not None:
            self._vote.read()
            self._vote = None

    def signal_name(self) -> str:
        """The signal this rank received, or a note that another rank received it."""
        return signal.Signals(self.received).name if self.received else "a signal another rank received"


class _Vote:
    """One step's flags on their way through the allreduce to the host.

    `.item()` on the sum would copy it on the compute stream, behind the next step's kernels, and
    so wait for that step too: the host would then queue the step after it onto an idle GPU, every
    step. The copy goes through a side stream instead, which waits for the flags and their
    allreduce only.
    """

    def __init__(self, flags: torch.Tensor, wait: Callable[[], torch.Tensor]) -> None:
        self.wait = wait
        self.device = flags.device
        self.written: Optional[torch.cuda.Event] = None
        if flags.is_cuda:
            self.written = torch.cuda.Event()
            self.written.record(torch.cuda.current_stream(self.device))  # right after the flags were filled

    def read(self) -> float:
        """The sum of every rank's flags (waits for the allreduce, not for later work)."""
        if self.written is None:
            return self.wait().item()
        side = torch.cuda.Stream(self.device)
        with torch.cuda.stream(side):
            side.wait_event(self.written)
            total = self.wait()  # a torch.distributed Work makes the current (side) stream wait for it
            host = torch.empty(1, pin_memory=True).copy_(total, non_blocking=True)
        side.synchronize()
        return host.item()


def ignore_preemption_signals(worker_id: int = 0) -> None:
    """For helper processes (data-loader workers): leave preemption to the training process."""
    ignore_signals(PREEMPTION_SIGNALS)


@dataclass(frozen=True)
class TestSignal:
    """HARNESS_TEST_SIGNAL: rank `rank` sends itself `signum` right after global step `step`."""

    signum: int
    step: int
    rank: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Optional[TestSignal]:
        value = environ.get(TEST_SIGNAL_VARIABLE)
        if not value:
            return None
        name, _, rest = value.partition("@")
        step, _, rank = rest.partition(":")
        name = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        try:
            return cls(int(signal.Signals[name]), int(step), int(rank or 0))
        except (KeyError, ValueError):
            raise UsageError(
                f"{TEST_SIGNAL_VARIABLE}={value!r} is not SIGNAL@STEP[:RANK] (e.g. TERM@5:1); fix it or unset it"
            ) from None

    def fire(self, step: int, rank: int) -> None:
        """Send the signal if this is the chosen rank and step."""
        if (step, rank) == (self.step, self.rank):
            print(
                f"rank {rank}: {TEST_SIGNAL_VARIABLE}: sending {signal.Signals(self.signum).name} to itself "
                f"after step {step}",
                flush=True,
            )
            os.kill(os.getpid(), self.signum)


def peer_failure(error: BaseException, rank: int, timeout: float, who: Optional[str] = None) -> PeerFailure:
    """The one-line PeerFailure for a collective that failed with `error`; `who` names the ranks that
    stopped, where the heartbeats tell (harness.process.heartbeat)."""
    first = first_line(error, limit=400)
    # gloo prefixes its messages with the source location: "[.../pair.cc:545] Read error ..."
    first = first.split("] ", 1)[1] if first.startswith("[") and "] " in first else first
    reason = first.split(". ")[0][:160]
    return PeerFailure(
        f"rank {rank} lost contact with a peer ({reason}); {who or 'another rank died or stopped answering'} "
        f"(collectives wait at most --timeout {timeout:g} s), so the job stops here"
    )
