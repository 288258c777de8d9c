"""What the three `--precision` settings do to numbers, to memory and to speed (notebook 06).

- `format_rows`: each format's range (largest, smallest normal and smallest subnormal value) and its
  rounding step (machine epsilon: the gap between 1 and the next number);
- `rounding_row`: what rounding the same float32 values to a format loses, optionally multiplied by a
  loss scale first (and divided by it after, as torch's GradScaler does);
- `saved_for_backward`: the bytes autograd keeps from one forward for the backward under a
  precision's autocast (the harness's own, harness.backends.precision), by dtype;
- `step_time_ratios`: each precision's step time over fp32's from interleaved rounds, with the
  paired interval of harness.study.scaling.intervals (t on log ratios).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch
from torch import nn

from ..backends.precision import Precision
from ..study.scaling.intervals import Interval, ratio_interval

FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def format_rows() -> list[dict[str, Any]]:
    """Per format (FORMATS): its bits, largest finite value, smallest normal value, smallest
    positive (subnormal) value, and rounding step (relative; a rounding error is at most half of it)."""
    rows = []
    for name, dtype in FORMATS.items():
        info = torch.finfo(dtype)
        rows.append(
            {
                "format": name,
                "bits": info.bits,
                "largest": info.max,
                "smallest normal": info.tiny,
                # below the smallest normal value, the spacing stays that of the lowest exponent
                "smallest subnormal": info.tiny * info.eps,
                "rounding step": info.eps,
            }
        )
    return rows


def rounding_row(values: torch.Tensor, name: str, scale: float = 1.0) -> dict[str, Any]:
    """What rounding the non-zero float32 `values` to format `name` loses, after multiplying them by
    `scale` (divided out again after rounding, in float32): how many become zero (flushed), subnormal
    (fewer significant bits) or infinite (overflowed), and the median and largest relative error
    (a flushed value's is 1). Raises KeyError for a name not in FORMATS."""
    dtype = FORMATS[name]
    exact = values.detach().float().flatten()
    exact = exact[exact != 0]
    scaled = exact * scale
    rounded = scaled.to(dtype)
    error = ((rounded.float() / scale - exact).abs() / exact.abs()).double()
    finite = error[torch.isfinite(error)]
    return {
        "format": name if scale == 1.0 else f"{name} x {scale:g}",
        "values": exact.numel(),
        "flushed to zero": int((rounded == 0).sum()),
        "subnormal": int(((rounded != 0) & (rounded.float().abs() < torch.finfo(dtype).tiny)).sum()),
        "overflowed": int(torch.isinf(rounded).sum()),
        "median relative error": float(finite.median()),
        "largest relative error": float(finite.max()),
    }


def saved_for_backward(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, precision: str) -> dict[str, int]:
    """Bytes of the tensors autograd keeps from one forward and cross-entropy loss of `model` for
    the backward, under `precision`'s autocast (fp32, bf16 or fp16), by dtype name, each storage
    once. The model's parameters, held anyway, are left out; the 16-bit copies autocast makes of
    them for the backward are counted. Raises UsageError for an unknown precision."""
    autocast = Precision.of(precision).autocast(images.device)
    kept: dict[int, tuple[str, int]] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = (str(tensor.dtype).replace("torch.", ""), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor), autocast:
        nn.functional.cross_entropy(model(images), labels)
    held = {parameter.untyped_storage().data_ptr() for parameter in model.parameters()}
    by_dtype: dict[str, int] = {}
    for address, (dtype, size) in kept.items():
        if address not in held:
            by_dtype[dtype] = by_dtype.get(dtype, 0) + size
    return by_dtype


def step_time_ratios(
    step_seconds: Mapping[str, Mapping[str, float]], baseline: str = "fp32"
) -> dict[str, tuple[float, Optional[Interval]]]:
    """Per precision other than `baseline`: its mean step time over the baseline's, and the 95%
    interval of that ratio (harness.study.scaling.intervals.ratio_interval: rounds paired, t on the log
    ratios; None with fewer than intervals.MIN_ROUNDS rounds). `step_seconds`: precision -> {round: seconds per step}."""
    ratios = {}
    for name, rounds in step_seconds.items():
        if name == baseline:
            continue
        shared = sorted(set(rounds) & set(step_seconds[baseline]))
        mean = sum(rounds[key] for key in shared) / max(sum(step_seconds[baseline][key] for key in shared), 1e-12)
        ratios[name] = (mean, ratio_interval(rounds, step_seconds[baseline]))
    return ratios
