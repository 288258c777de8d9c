"""The learning-rate rules: scaling by global batch, per-step warmup, schedules."""

import math

import pytest

from harness.training.lr import learning_rate, scaled_lr


@pytest.mark.parametrize("rule, expected", [("none", 0.1), ("linear", 0.8), ("sqrt", 0.1 * math.sqrt(8))])
def test_global_batch_scales_the_base_lr(rule, expected):
    assert scaled_lr(0.1, global_batch=512, base_batch=64, rule=rule) == pytest.approx(expected)


def test_warmup_ramps_per_step_from_base_to_scaled_lr():
    lrs = [
        learning_rate(s, base_lr=0.1, peak_lr=0.8, warmup_steps=7, total_steps=100, schedule="constant")
        for s in range(10)
    ]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[7:] == [pytest.approx(0.8)] * 3
    assert all(b > a for a, b in zip(lrs[:8], lrs[1:8]))  # strictly increasing during warmup
    assert lrs[3] == pytest.approx(0.1 + 0.7 * 3 / 7)


def test_step_schedule_divides_by_ten_at_half_and_three_quarters():
    def lr(s):
        return learning_rate(s, base_lr=1, peak_lr=1, warmup_steps=0, total_steps=100, schedule="step")

    assert [lr(0), lr(49), lr(50), lr(74), lr(75), lr(99)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])


def test_cosine_decays_from_peak_towards_zero_after_warmup():
    def lr(s):
        return learning_rate(s, base_lr=0.1, peak_lr=1, warmup_steps=10, total_steps=110, schedule="cosine")

    assert lr(10) == pytest.approx(1)
    assert lr(60) == pytest.approx(0.5)
    assert lr(109) < 0.001


def test_unknown_rules_name_the_known_ones():
    with pytest.raises(ValueError, match="none, linear, sqrt"):
        scaled_lr(0.1, 64, 64, "quadratic")
