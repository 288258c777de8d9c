"""Scaling and POP efficiency arithmetic: pure functions of measured numbers, no I/O, no torch.

Definitions (REFERENCE.md section 6):

- speedup(N) = T(N) / T(1), throughputs in samples/s. For weak scaling (fixed batch per worker)
  this is the throughput ratio by definition; for strong scaling (fixed global batch) every step
  processes the same samples, so the throughput ratio equals the step-time ratio, the classic
  strong-scaling speedup. One formula serves both.
- scaling efficiency(N) = speedup(N) / N (1.0 is perfect scaling).
- POP multiplicative model, from per-rank *useful* time (compute outside communication and data
  waiting) over a window of `runtime` seconds:
  load balance = mean(useful) / max(useful);
  communication efficiency = max(useful) / runtime;
  parallel efficiency = load balance x communication efficiency = mean(useful) / runtime.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence


def speedup(throughput: float, baseline_throughput: float) -> Optional[float]:
    """How many times the baseline's throughput `throughput` is (None without a positive baseline)."""
    if not baseline_throughput or baseline_throughput <= 0:
        return None
    return throughput / baseline_throughput


def scaling_efficiency(throughput: float, workers: int, baseline_throughput: float,
                       baseline_workers: int = 1) -> Optional[float]:
    """speedup / (workers / baseline_workers): 1.0 when throughput grows in proportion to the workers.

    With a baseline of one worker this is the textbook speedup(N) / N; a larger baseline (e.g. when
    a study starts at one node of 4 GPUs) measures scaling relative to that starting point.
    """
    ratio = speedup(throughput, baseline_throughput)
    if ratio is None or workers <= 0 or baseline_workers <= 0:
        return None
    return ratio * baseline_workers / workers


def load_balance(useful: Sequence[float]) -> Optional[float]:
    """mean(useful) / max(useful) over ranks: 1.0 when every rank computes for as long as the slowest."""
    if not useful or max(useful) <= 0:
        return None
    return sum(useful) / len(useful) / max(useful)


def communication_efficiency(useful: Sequence[float], runtime: float) -> Optional[float]:
    """max(useful) / runtime: the share of the run the busiest rank spends on useful compute."""
    if not useful or runtime <= 0:
        return None
    return max(useful) / runtime


def parallel_efficiency(useful: Sequence[float], runtime: float) -> Optional[float]:
    """load balance x communication efficiency (= mean(useful) / runtime)."""
    balance, communication = load_balance(useful), communication_efficiency(useful, runtime)
    if balance is None or communication is None:
        return None
    return balance * communication


def pop_metrics(useful: Sequence[float], runtime: float) -> Dict[str, Optional[float]]:
    """The three POP multiplicative metrics, keyed as they appear in results records."""
    return {
        "load_balance": load_balance(useful),
        "communication_efficiency": communication_efficiency(useful, runtime),
        "parallel_efficiency": parallel_efficiency(useful, runtime),
    }


def accelerator_utilisation(compute: float, data_wait: float) -> Optional[float]:
    """AU as DLIO defines it: compute / (compute + time waiting for data); sums over ranks go in."""
    total = compute + data_wait
    if total <= 0:
        return None
    return compute / total


# Phases of one training step, in the order they happen; the loop measures each rank's totals.
STEP_PHASES = ("data_wait", "forward_backward", "communication", "optimizer", "other")


def rank_breakdown(runtime: float, data_wait: float, gradient_phase: float, optimizer: float,
                   compute_estimate: Optional[float]) -> Dict[str, Optional[float]]:
    """Split one rank's timed window (seconds, totals over its steps) into STEP_PHASES plus `useful`.

    gradient_phase is forward + backward + waiting until the gradients are averaged over ranks;
    compute_estimate is forward + backward alone for the same steps (None when not measured). The
    communication share is what the phase took beyond pure compute, never negative (calibration
    noise on a single rank could otherwise make it so). `other` is loop bookkeeping plus the wait at
    the window's closing barrier. Useful time (POP) = forward + backward compute + optimizer.
    """
    if compute_estimate is None:
        compute = communication = useful = None
    else:
        compute = min(max(compute_estimate, 0.0), gradient_phase)
        communication = gradient_phase - compute
        useful = compute + optimizer
    return {
        "runtime": runtime,
        "data_wait": data_wait,
        "forward_backward": compute,
        "communication": communication,
        "optimizer": optimizer,
        "other": max(runtime - data_wait - gradient_phase - optimizer, 0.0),
        "useful": useful,
    }
