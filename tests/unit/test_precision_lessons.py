"""What notebook 06 measures about the precisions: formats, rounding, tensors kept for backward, speed ratios."""

from __future__ import annotations

import pytest
import torch

from harness import UsageError
from harness.workshop import format_rows, rounding_row, saved_for_backward, step_time_ratios


def test_format_rows_give_each_formats_range_and_rounding_step():
    rows = {row["format"]: row for row in format_rows()}
    assert rows["fp16"]["largest"] == 65504 and rows["fp16"]["smallest subnormal"] == 2.0**-24
    assert rows["bf16"]["smallest normal"] == rows["fp32"]["smallest normal"] == 2.0**-126
    assert rows["bf16"]["rounding step"] == 2.0**-7 and rows["fp32"]["rounding step"] == 2.0**-23


def test_rounding_row_counts_flushed_subnormal_and_overflowed_values_and_a_scale_rescues_them():
    values = torch.tensor([1e-9, 1e-6, 1.0, 1e5, 0.0])  # the zero is left out
    fp16 = rounding_row(values, "fp16")
    assert (fp16["values"], fp16["flushed to zero"], fp16["subnormal"], fp16["overflowed"]) == (4, 1, 1, 1)
    assert fp16["largest relative error"] == 1.0  # the flushed value; the infinite one has no finite error
    scaled = rounding_row(values[:3], "fp16", 2.0**16)
    assert scaled["format"] == "fp16 x 65536" and scaled["flushed to zero"] == scaled["subnormal"] == 0
    bf16 = rounding_row(values, "bf16")
    assert bf16["flushed to zero"] == bf16["subnormal"] == bf16["overflowed"] == 0
    assert 0 < bf16["largest relative error"] <= 2.0**-8  # half its rounding step
    assert rounding_row(values, "fp32")["largest relative error"] == 0.0


def test_saved_for_backward_counts_16_bit_activations_and_weight_copies_but_not_the_weights():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    images, labels = torch.randn(8, 16), torch.randint(0, 4, (8,))
    fp32 = saved_for_backward(model, images, labels, "fp32")
    bf16 = saved_for_backward(model, images, labels, "bf16")
    # fp32: the input, the hidden activation, the logits and the loss; the second layer's weight is a
    # parameter (held anyway), the labels int64
    assert fp32 == {"float32": 4 * (8 * 16 + 8 * 32 + 8 * 4) + 4, "int64": 8 * 8}
    # bf16: the input, the hidden activation and the 16-bit copy of the second layer's weight (the
    # first layer's is not needed: its input needs no gradient); logits and loss stay float32
    assert bf16 == {"bfloat16": 2 * (8 * 16 + 8 * 32 + 32 * 4), "float32": 4 * 8 * 4 + 4, "int64": 8 * 8}
    with pytest.raises(UsageError, match="precision"):
        saved_for_backward(model, images, labels, "fp8")


def test_step_time_ratios_pair_rounds_and_say_when_one_round_is_too_few():
    ratios = step_time_ratios(
        {"fp32": {"0": 1.0, "1": 2.0, "2": 1.5}, "fp16": {"0": 3.0, "1": 6.0, "2": 4.5}, "bf16": {"0": 1.0}}
    )
    mean, interval = ratios["fp16"]
    assert mean == pytest.approx(3.0) and interval == pytest.approx((3.0, 3.0))
    assert ratios["bf16"] == (1.0, None) and "fp32" not in ratios
