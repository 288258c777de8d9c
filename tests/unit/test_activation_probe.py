"""The activation probe behind `harness predict`'s memory table runs with shapes only (FakeTensor):
it saves what the CPU's real forward saves, byte for byte, but for BatchNorm's saved statistics
under autocast (float32 on the CPU, half in the shape rule: 4 bytes a channel), and a model of a
billion parameters is probed without its memory."""

from __future__ import annotations

import pytest
from torch import nn

from harness.data.indexed import as_indexed
from harness.study.prediction import memory
from harness.tasks.loading import load_task
from tests.helpers.tasks import TASK_FILE

SMALL = {"tokens": "synthetic", "layers": 2, "width": 64, "heads": 4, "sequence_length": 32}
LARGE = {"tokens": "synthetic", "layers": 24, "width": 2048, "heads": 16, "sequence_length": 1024}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(
    ("task", "args"), [("transformer", SMALL), (f"{TASK_FILE}:regression", {}), (f"{TASK_FILE}:tokens", {})]
)
def test_shapes_only_saves_what_the_real_forward_saves(task, args, precision):
    loaded = load_task(task, args)
    data = as_indexed(loaded.task.train_data, "train_data")
    real = memory._probe(loaded, data, precision, shapes_only=False)
    shapes_only = memory._probe(loaded, data, precision, shapes_only=True)
    channels = sum(m.num_features for m in loaded.task.build_model().modules() if isinstance(m, nn.BatchNorm1d))
    halved = 4 * channels if precision != "fp32" else 0  # mean and inverse std, 2 bytes each less
    assert [r - f for r, f in zip(real, shapes_only)] == [halved, halved] and min(real) > 0


def test_a_billion_parameter_model_is_probed_with_shapes_only():
    memory._measured.cache_clear()
    activations = memory.task_activations("transformer", LARGE, "bf16")
    assert "with shapes only (FakeTensor)" in activations.source
    # 24 blocks of 1,024 tokens of width 2,048 save at least each block's bf16 input to its first linear.
    assert activations.per_sample > 24 * 1024 * 2048 * 2


def test_memory_per_rank_is_what_harness_predict_prints_for_the_backend():
    import harness
    from harness.backends.memory import Training, predict_memory
    from harness.study.prediction.shapes import task_shape

    options = {"zero_stage": 3, "zero_bucket_mb": 4}
    config = harness.TrainConfig(
        backend="deepspeed",
        backend_options=options,
        task="transformer",
        task_args=SMALL,
        batch_size=3,
        optimizer="adam",
    )
    found = harness.memory_per_rank(config, 4)
    training = Training(precision="fp32", optimizer="adam", micro_batch=3, world_size=4)
    activations = memory.task_activations("transformer", SMALL, "fp32")
    expected = predict_memory(task_shape("transformer", SMALL), "deepspeed", options, training, activations)
    assert found == expected and found.backend == "deepspeed zero_stage=3 zero_bucket_mb=4"
    assert found.total() > found.model_state() > 0
