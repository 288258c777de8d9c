"""The ring allreduce model and the numbers of `harness bench allreduce`, with no torch: the
settings, message sizes, nccl-tests' algbw and busbw, the alpha-beta fit, the printed table.
(harness.study.prediction.bench measures; this module is what its measurements mean.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from ...errors import UsageError

KIB, MIB = 1024, 1024 * 1024
# 4 KiB to 256 MiB by factors of 4: on a 2-core CPU, 2 ranks over gloo take about half a minute.
DEFAULT_SIZES = tuple(4 * KIB * 4**k for k in range(9))
ELEMENT_BYTES = 4  # float32
# A ring's steps per rank count, as multiples of (n-1): all_reduce is a reduce-scatter and an all-gather.
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}


@dataclass
class BenchSettings:
    """What `harness bench allreduce` measures (its flags, or the Python API's arguments)."""

    backend: str = "ddp"
    collective: str = "all_reduce"  # all_reduce, all_gather or reduce_scatter
    ranks: Optional[int] = None  # start this many local ranks; None: this process is one rank of a job
    sizes: Sequence[int] = DEFAULT_SIZES  # message sizes in bytes (rounded down to whole float32s)
    seconds_per_size: float = 0.4  # time budget per size, repetitions agreed from a warm-up
    min_repeats: int = 3
    max_repeats: int = 100
    results: Optional[str] = None  # JSON file the result is written to (rank 0)
    launcher: Optional[str] = None  # local runs: instead of the backend's own
    device: str = "auto"
    timeout: float = 300.0

    def check(self) -> None:
        """UsageError for settings that cannot be measured."""
        if not self.sizes or any(size < ELEMENT_BYTES for size in self.sizes):
            raise UsageError(f"--sizes needs sizes of at least {ELEMENT_BYTES} bytes, e.g. --sizes 4K,1M,64M")
        if self.collective not in RING_STEPS:
            raise UsageError(f"--collective is one of {', '.join(RING_STEPS)}, got {self.collective!r}")
        if self.ranks is not None and self.ranks < 1:
            raise UsageError(f"-n must be a positive number of ranks, got {self.ranks}")
        if not self.seconds_per_size > 0 or not 1 <= self.min_repeats <= self.max_repeats:
            raise UsageError("--seconds-per-size must be positive and 1 <= --min-repeats <= --max-repeats")


def parse_sizes(text: str) -> list[int]:
    """'4K,1M,256M' (K, M, G: powers of 1024; plain numbers are bytes) -> bytes, ascending."""
    sizes = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        scale = {"K": KIB, "M": MIB, "G": 1024 * MIB}.get(part[-1].upper(), 1)
        number = part[:-1] if scale > 1 else part
        try:
            sizes.append(int(float(number) * scale))
        except ValueError:
            raise UsageError(f"--sizes takes sizes such as 4K,1M,256M; got {part!r}") from None
    if not sizes:
        raise UsageError("--sizes needs at least one size, e.g. --sizes 4K,1M,64M")
    return sorted(set(sizes))


def ring_allreduce_seconds(size: float, ranks: int, alpha: float, busbw: float) -> float:
    """The ring model's time for one allreduce of `size` bytes over `ranks` ranks (0 for one rank)."""
    if ranks < 2:
        return 0.0
    return 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * size / busbw


def fit_alpha_beta(
    sizes: Sequence[float], seconds: Sequence[float], ranks: int, collective: str = "all_reduce"
) -> Optional[dict[str, Any]]:
    """alpha (s per step) and busbw (bytes/s) of the ring model, least squares on relative error.

    With a = steps x alpha and b = 2(n-1)/n / busbw the model is t = a + b S, linear in (a, b);
    weights 1/t^2 make it minimise the squared relative errors. A negative intercept (latency below
    the noise) is fitted as zero. None for one rank, or fewer than two sizes.
    """
    if ranks < 2 or len(sizes) < 2:
        return None
    steps = RING_STEPS[collective] * (ranks - 1)
    factor = steps / ranks
    weights = [1 / t**2 for t in seconds]
    sw = sum(weights)
    sx = sum(w * s for w, s in zip(weights, sizes))
    sxx = sum(w * s * s for w, s in zip(weights, sizes))
    sy = sum(w * t for w, t in zip(weights, seconds))
    sxy = sum(w * s * t for w, s, t in zip(weights, sizes, seconds))
    determinant = sw * sxx - sx * sx
    intercept = (sxx * sy - sx * sxy) / determinant if determinant else 0.0
    if intercept < 0 or not determinant:
        intercept = 0.0
    slope = (sxy - intercept * sx) / sxx
    if slope <= 0:
        return None  # time does not grow with size: nothing to fit a bandwidth to
    alpha, busbw = intercept / steps, factor / slope
    errors = [abs(steps * alpha + factor * s / busbw - t) / t for s, t in zip(sizes, seconds)]
    multiple = "2(n-1)" if RING_STEPS[collective] == 2 else "(n-1)"
    return {
        "model": f"time = {multiple} x alpha + {multiple}/n x bytes / busbw (NCCL's ring {collective})",
        "collective": collective,
        "ranks": ranks,
        "steps": steps,
        "alpha_s": alpha,
        "busbw_bytes_per_s": busbw,
        "max_relative_error": max(errors),
        "mean_relative_error": sum(errors) / len(errors),
    }


def size_result(size: int, seconds: float, ranks: int, repeats: int, collective: str = "all_reduce") -> dict[str, Any]:
    """One size's line, as nccl-tests prints it: time, algbw and busbw (size: the whole buffer)."""
    algbw = size / seconds if seconds > 0 else None
    factor = RING_STEPS[collective] * (ranks - 1) / ranks
    return {
        "bytes": size,
        "seconds": seconds,
        "repeats": repeats,
        "algbw_bytes_per_s": algbw,
        "busbw_bytes_per_s": algbw * factor if algbw and ranks > 1 else None,
    }


def repeats_for(warmup_seconds: float, settings: BenchSettings) -> int:
    """How many timed repetitions fit the budget, from one warm-up repetition's time."""
    if warmup_seconds <= 0:
        return settings.max_repeats
    fitting = math.floor(settings.seconds_per_size / warmup_seconds)
    return int(min(settings.max_repeats, max(settings.min_repeats, fitting)))


def format_result(result: dict[str, Any]) -> str:
    """nccl-tests-like lines, then the fit."""
    lines = [
        f"{result.get('collective', 'all_reduce')}, {result['backend']}, {result['world_size']} ranks on {result['nodes']} node(s), "
        f"{result['device']}; load average {result.get('load_average') or 0:.1f} on {result['cores']} cores"
        + (
            " (contended: " + "; ".join(result["contention"]["reasons"][:2]) + ")"
            if result.get("contention", {}).get("flagged")
            else ""
        ),
        f"{'bytes':>12} {'repeats':>8} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}",
    ]
    for line in result["sizes"]:
        algbw, busbw = line["algbw_bytes_per_s"], line["busbw_bytes_per_s"]
        lines.append(
            f"{line['bytes']:>12} {line['repeats']:>8} {line['seconds'] * 1e6:>12.1f} "
            + " ".join(f"{value / 1e9:>13.3f}" if value else f"{'-':>13}" for value in (algbw, busbw))
        )
    fit = result.get("fit")
    lines.append(
        f"fit: alpha {fit['alpha_s'] * 1e6:.1f} us per step, busbw {fit['busbw_bytes_per_s'] / 1e9:.3f} GB/s "
        f"(max error {fit['max_relative_error']:.0%})"
        if fit
        else "fit: none (one rank communicates nothing, or time did not grow with size: rerun on a quieter machine)"
    )
    return "\n".join(lines)
