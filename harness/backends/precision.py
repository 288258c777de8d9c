"""Numeric precision of a run, the same semantics under every backend (`--precision`).

- fp32: float32 weights, activations and gradients.
- bf16: `torch.autocast(dtype=bfloat16)` around forward and loss; weights, gradients and optimizer
  state stay float32 and gradients are averaged in float32. No loss scaling (bf16 has float32's
  exponent range).
- fp16: the same with float16 autocast, plus dynamic loss scaling with torch's GradScaler settings
  written out below; a step whose scaled gradients overflow is skipped (and counted in the record)
  and the scale backs off. DeepSpeed runs this through its `torch_autocast` section, whose scaler
  has the same settings (harness/backends/deepspeed.py checks that).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..errors import unknown_choice

# torch.amp.GradScaler's defaults, set explicitly so that every backend scales alike.
LOSS_SCALE = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


@dataclass(frozen=True)
class Precision:
    """What one `--precision` value means for the loop and the backends."""

    name: str
    autocast_dtype: Optional[torch.dtype]  # forward and loss run under torch.autocast in this dtype
    loss_scaling: bool

    @classmethod
    def of(cls, name: str) -> Precision:
        """The Precision of a `--precision` value."""
        if name not in PRECISION_TABLE:
            raise unknown_choice("precision", name, PRECISION_TABLE)
        return PRECISION_TABLE[name]

    def autocast(self, device: torch.device) -> AbstractContextManager:
        """Context for forward and loss: autocast in the reduced dtype, or nothing."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype)

    def grad_scaler(self, device: torch.device) -> Optional[torch.amp.GradScaler]:
        """A dynamic loss scaler with the shared settings (fp16), else None."""
        if not self.loss_scaling:
            return None
        return torch.amp.GradScaler(device.type, **LOSS_SCALE)

    def record(self) -> dict[str, Any]:
        """The settings as the results record's `math` section states them."""
        return {
            "precision": self.name,
            "weights_dtype": "float32",  # and gradients, optimizer state
            "autocast_dtype": str(self.autocast_dtype).replace("torch.", "") if self.autocast_dtype else None,
            "loss_scaling": {"mode": "dynamic", **LOSS_SCALE} if self.loss_scaling else None,
        }


PRECISION_TABLE = {
    "fp32": Precision("fp32", None, False),
    "bf16": Precision("bf16", torch.bfloat16, False),
    "fp16": Precision("fp16", torch.float16, True),
}
