"""A study's prediction, written before its runs, set beside what they measured."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.backends import BACKENDS
from harness.study.prediction.foresight import PREDICTION_FILE, prediction_markdown, prediction_rows, write_prediction
from tests.conftest import REPO
from tests.helpers.handmade_records import record

DISTRIBUTED = sorted(name for name, cls in BACKENDS.items() if cls.max_world_size is None)


def _run(backend, world_size, runtime, repeat):
    run = record(backend, world_size, 256 * world_size / runtime, local_batch=256, model="resnet50", repeat=repeat)
    run["step_breakdown"]["seconds_per_step"] = {
        "runtime": runtime,
        "forward_backward": 0.09,
        "optimizer": 0.005,
        "data_wait": 0.001,
        "other": 0.002,
        "communication": 0.0,
    }
    run["step_breakdown"]["timed_steps"] = 20
    run.update(local_world_size=4, gradient_bytes=102_228_128, tuning={})
    return run


def test_the_plan_is_predicted_before_the_runs_and_the_report_gives_the_error(tmp_path):
    path = write_prediction(
        str(tmp_path),
        "polaris",
        DISTRIBUTED,
        [2, 1, 2],
        ["--model", "resnet50", "--dataset", "synthetic", "--batch-size", "256"],
    )
    saved = json.loads((tmp_path / PREDICTION_FILE).read_text())
    assert path.endswith(PREDICTION_FILE) and set(saved["backends"]) == set(DISTRIBUTED)
    for planned in saved["backends"].values():
        assert [row["nodes"] for row in planned["rows"]] == [1, 2]
        assert planned["traffic"] and 0 < planned["rows"][1]["efficiency"] <= 1  # from the 1-GPU anchor
    assert saved["compute"]["samples_per_s"] == 2470
    backend = DISTRIBUTED[0]
    runs = [
        _run(backend, 4, 0.100, 0),
        _run(backend, 4, 0.102, 1),
        _run(backend, 8, 0.110, 0),
        _run(backend, 8, 0.114, 1),
    ]
    rows = prediction_rows(str(tmp_path), runs)
    assert [(r["backend"], r["nodes"]) for r in rows] == [(backend, 1), (backend, 2)]
    # The node measured first: its own step (the geometric mean of its runs) is the prediction at one node.
    assert rows[0]["predicted_step_s"] == pytest.approx((0.100 * 0.102) ** 0.5) and rows[0]["error"] == pytest.approx(
        0.0, abs=1e-9
    )
    two_nodes = (0.110 * 0.114) ** 0.5
    assert rows[1]["measured_step_s"] == pytest.approx(two_nodes) and rows[1]["measured_interval_s"] is None
    assert rows[1]["error"] == pytest.approx(rows[1]["predicted_step_s"] / two_nodes - 1)
    table = prediction_markdown(rows)
    assert "| error" in table and f"{rows[1]['error']:+.1%}" in table


def test_a_site_without_network_figures_writes_why_and_reports_nothing(tmp_path):
    write_prediction(str(tmp_path), "generic-slurm", DISTRIBUTED, [1, 2], [])
    assert "has no network figures" in json.loads((tmp_path / PREDICTION_FILE).read_text())["skipped"]
    assert prediction_rows(str(tmp_path), [_run(DISTRIBUTED[0], 4, 0.1, 0)]) == []


def test_the_plan_prices_the_runs_task_from_their_flags(tmp_path):
    from harness.backends.traffic import ModelShape
    from harness.study.prediction.predict import backend_traffic
    from harness.training.plan import model_shape
    from tests.helpers.tasks import regression

    spec = f"{REPO}/tests/helpers/tasks.py:regression"
    flags = ["--task", spec, "--task-arg", "width=64", "--batch-size", "16"]
    write_prediction(str(tmp_path), "polaris", ["fsdp"], [1, 2], [*flags, "--fsdp-keep-gathered"])
    saved = json.loads((tmp_path / PREDICTION_FILE).read_text())
    shape = model_shape(regression(width=64).build_model())
    assert saved["task"] == {
        "spec": spec,
        "args": {"width": 64},
        "parameter_bytes": shape.parameter_bytes,
    }
    assert saved["batch_size"] == 16 and saved["compute"].startswith("none published for this task")
    # FSDP's traffic per unit of this model (three layers with parameters), with the runs' own option.
    fsdp = backend_traffic("fsdp", {"keep_gathered": True}, shape)
    assert saved["backends"]["fsdp"]["traffic"] == [dataclasses.asdict(call) for call in fsdp]
    assert fsdp != backend_traffic("fsdp", {"keep_gathered": True}, ModelShape(shape.parameter_bytes))


def test_the_report_sets_each_runs_predicted_memory_beside_the_measured_with_the_error(tmp_path):
    write_prediction(str(tmp_path), "polaris", DISTRIBUTED, [1], ["--model", "resnet50", "--dataset", "synthetic"])
    backend, gib = DISTRIBUTED[0], 2**30
    runs = [_run(backend, 4, 0.100, repeat) for repeat in range(2)]
    for run, peak in zip(runs, (10 * gib, 12 * gib)):  # on a GPU: the allocator's peak, the largest rank's
        run["memory"] = {"source": "cuda_allocator", "peak_bytes_per_rank": [peak - gib, peak], "predicted": {}}
        run["memory"]["predicted"] = {"total_bytes": 12.1 * gib, "model_state_bytes": 4 * gib}
    cpu = _run(backend, 4, 0.100, 2)  # on the CPU: the counted model state, torch's own resident set left out
    cpu["memory"] = {
        "source": "rss_peak",
        "peak_bytes_per_rank": [2 * gib] * 4,
        "model_state_bytes_per_rank": {"total": [3 * gib, 3 * gib, 5 * gib, 4 * gib]},
        "predicted": {"total_bytes": 6 * gib, "model_state_bytes": 4.5 * gib},
    }
    (gpu_row,) = prediction_rows(str(tmp_path), runs)
    assert gpu_row["memory_compared"] == "peak" and gpu_row["measured_memory_bytes"] == 11 * gib
    assert gpu_row["memory_error"] == pytest.approx(12.1 / 11 - 1)
    (cpu_row,) = prediction_rows(str(tmp_path), [cpu])
    assert cpu_row["memory_compared"] == "model state" and cpu_row["memory_error"] == pytest.approx(4.5 / 5 - 1)
    assert f"{gpu_row['memory_error']:+.1%}" in prediction_markdown([gpu_row])
    (none,) = prediction_rows(str(tmp_path), [_run(backend, 4, 0.1, 0)])
    assert none["memory_error"] is None and "| memory error" in prediction_markdown([none])
