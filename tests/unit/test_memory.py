"""The record's peak memory covers the timed window only: what a rank held before it (start-up, the
full model before sharding) and after it (evaluation) is not in the figure. Its model state counts
each live storage once, in weights, gradients or the optimizer's and framework's tensors (sharded
runs: tests/integration/test_equivalence.py's Adam test)."""

from __future__ import annotations

import types

import numpy as np
import torch
from torch import nn

from harness.training.memory import MODEL_STATE, RSS_PEAK, WindowPeak, memory_section, model_state_bytes, peak_memory
from harness.training.timing import SCALARS

MIB = 2**20


def _touch(mebibytes: int) -> np.ndarray:
    return np.ones(mebibytes * MIB, dtype=np.uint8)  # written, so resident


def test_the_window_peak_leaves_out_what_the_process_held_before_the_window():
    before = _touch(400)
    del before  # a large block goes back to the kernel; VmHWM keeps the 400 MiB
    process_peak, _ = peak_memory(torch.device("cpu"))
    window = WindowPeak(torch.device("cpu"))
    window.open()
    inside = _touch(50)
    window.close()
    del inside
    peak, source, whole_process = window.result()
    assert (source, whole_process) == (RSS_PEAK, False)
    assert peak < process_peak - 300 * MIB, (peak / MIB, process_peak / MIB)


def test_the_highest_window_counts_and_a_run_without_a_window_reports_the_whole_process():
    window = WindowPeak(torch.device("cpu"))
    assert window.result()[2] is True  # never opened: the process's peak, said so
    window.open()
    big = _touch(200)
    window.close()
    del big
    first = window.bytes
    window.open()
    window.close()
    assert window.result()[0] == first  # the second, smaller window does not lower it


def test_the_section_says_what_the_figure_covers():
    assert "timed window" in memory_section([1.0], RSS_PEAK, False)["scope"]
    assert "since it started" in memory_section([1.0], RSS_PEAK, True)["scope"]


def _adam_after_one_step(model: nn.Module) -> torch.optim.Optimizer:
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(3, 8)).sum().backward()
    optimizer.step()
    model(torch.ones(3, 8)).sum().backward()  # the gradients of the next step, as the loop counts them
    return optimizer


def test_the_model_state_counts_weights_gradients_the_optimizers_state_and_the_frameworks_copies():
    model = nn.Linear(8, 4)
    optimizer = _adam_after_one_step(model)
    # As ZeRO keeps it: a float32 copy of the weights it optimizes, beside the optimizer it wraps.
    master = torch.zeros(sum(p.numel() for p in model.parameters()))
    framework = types.SimpleNamespace(model=model, wrapper=types.SimpleNamespace(optimizer=optimizer, master=master))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    adam = sum(t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values())
    assert adam >= 2 * weights  # two moments per weight, and each parameter's step count
    assert model_state_bytes(model, framework) == dict(zip(MODEL_STATE, (weights, weights, adam, master.nbytes)))


def test_views_of_one_buffer_count_once_and_nothing_is_reached_through_a_function():
    model = nn.Linear(8, 4)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))
    offset = 0
    for name, parameter in list(model.named_parameters()):  # as ZeRO-1/2 make the weights views of one buffer
        view = flat[offset : offset + parameter.numel()].view_as(parameter)
        setattr(model, name, nn.Parameter(view))
        offset += parameter.numel()
    hidden = torch.zeros(10_000)
    framework = types.SimpleNamespace(model=model, buffers=[flat, flat[:4]], later=lambda: hidden)
    state = model_state_bytes(model, framework)
    assert state == {"weights": flat.nbytes, "gradients": 0, "optimizer": 0, "framework": 0}


def test_a_run_that_counted_no_model_state_says_so_and_one_that_did_sums_its_parts():
    assert memory_section([1.0], RSS_PEAK, False)["model_state_bytes_per_rank"] is None
    uncounted = {part: [10.0, -1.0] for part in MODEL_STATE}  # rank 1 ran no step before its window
    assert memory_section([1.0, 1.0], RSS_PEAK, False, uncounted)["model_state_bytes_per_rank"] is None
    counted = memory_section([1.0, 1.0], RSS_PEAK, False, {part: [10.0, 4.0] for part in MODEL_STATE})
    assert counted["model_state_bytes_per_rank"]["total"] == [10 * len(MODEL_STATE), 4 * len(MODEL_STATE)]


def test_every_quantity_gathered_from_the_ranks_has_a_column_of_its_own():
    # The model state's part "optimizer" once shared its column with the optimizer phase: the
    # record's communication efficiency came out at 2.9e7.
    assert len(set(SCALARS)) == len(SCALARS), SCALARS
