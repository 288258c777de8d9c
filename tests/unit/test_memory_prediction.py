"""Memory per rank, predicted (harness.backends.memory): the parts of a small model of known shape
under every backend of the registry, checked against values computed by hand; sharding divides by
the world size where the backend shards; precision leaves weights, gradients and optimizer state
float32 (the kit's autocast); and a one-process run's record holds a prediction whose model state
equals the one the run counted."""

from __future__ import annotations

import pytest

from harness import train
from harness.backends import BACKENDS
from harness.backends.memory import MIB, Activations, Training, predict_memory
from harness.backends.traffic import ModelShape
from harness.config import TrainConfig
from harness.study.prediction.memory import fitting, memory_rows
from tests.helpers.tasks import TASK_FILE

# 1000 float32 weights: a unit of 250 and one of 750, each one module holding its parameters.
SHAPE = ModelShape(4000, (1000, 3000), (1000, 3000))
ACTIVATIONS = Activations(per_sample=100.0, fixed=60.0, source="given")
BUCKET = 500_000_000 * 4  # DeepSpeed's default reduce_bucket_size, float32
ADAM = 2 * 4000 + 4 * 4  # two moments per weight and a step count per tensor (4 tensors)
# On the CPU torch's Adam steps one tensor at a time, making two of its size: twice the largest module.
STEP = {"optimizer step temporaries": 2 * 3000}

# backend, options -> {part: bytes} at 4 ranks, Adam, micro-batch 8, 4 parameter tensors
EXPECTED = {
    ("none", ()): {"weights": 4000, "gradients": 4000, "optimizer": ADAM, **STEP},
    ("ddp", ()): {"weights": 4000, "gradients": 4000, "optimizer": ADAM, **STEP},
    ("horovod", ()): {"weights": 4000, "gradients": 4000, "optimizer": ADAM, "fusion buffer": 128 * MIB, **STEP},
    ("deepspeed", (("zero_stage", 0),)): {
        "weights": 4000,
        "gradients": 4000,
        "optimizer": ADAM,
        "flattened gradients": 4000,
        **STEP,
    },
    ("deepspeed", (("zero_stage", 2),)): {
        "weights": 4000,
        "float32 slice": 1000,
        "gradient slices": 1000 + 2 * 1000,  # its slice's, and a copy at each of its 2 boundaries
        "optimizer": 2 * 1000 + 4,  # over one flat slice: one step count
        "reduce bucket": BUCKET,
        "optimizer step temporaries": 3 * 1000,  # the slice's gradients flattened, and Adam's two
    },
    ("deepspeed", (("zero_stage", 3), ("zero_bucket_mb", 1.0))): {
        "weights": 1000 + 4000,  # the slice, and both modules whole (under 1e5 elements each)
        "float32 slice": 1000,
        "gradient slice": 1000,
        "optimizer": 2 * 1000 + 4,
        "reduce bucket": MIB,
        "gathered weights": 0,  # every weight is whole already
        "optimizer step temporaries": 3 * 1000,  # one sub-group: the whole slice
    },
    ("fsdp", ()): {
        "weights": 1000,
        "gradients": 1000,
        "optimizer": 2 * 1000 + 4 * 4,
        "gathered units": 4000,  # twice the largest unit, at most the model
        "unsharded gradients": 3000,
        "optimizer step temporaries": 2 * 752,  # twice the largest module's shard (750 elements: 188 a rank)
    },
}


def _training(precision: str = "fp32", world_size: int = 4, **changes) -> Training:
    values = {"optimizer": "adam", "micro_batch": 8, "world_size": world_size, "parameter_tensors": 4, **changes}
    return Training(precision=precision, **values)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize(
    "case", list(EXPECTED), ids=lambda case: " ".join([case[0], *(f"{k}={v}" for k, v in case[1])])
)
def test_each_backends_parts_are_the_hand_computed_ones_at_every_precision(case, precision):
    backend, options = case
    prediction = predict_memory(SHAPE, backend, dict(options), _training(precision), ACTIVATIONS)
    parts = {part.name: part.bytes for part in prediction.parts}
    assert parts == {**EXPECTED[case], "activations": 60 + 100 * 8}
    step = parts.pop("optimizer step temporaries")
    made = sum(parts[part.name] for part in prediction.parts if not part.held and part.name in parts)
    assert prediction.total() == prediction.model_state() + max(made, step)
    assert any(precision in line for line in prediction.assumptions)


def test_the_optimizer_steps_temporaries_count_at_the_peak_where_they_outgrow_forward_and_backward():
    """Activations are freed before the step: the peak is the kept state plus the larger phase. On GPUs
    torch's Adam steps every tensor at once (one copy of them all); ZeRO-3 steps a sub-group at a time."""
    shape = ModelShape(4 * 8_000_000, (4 * 2_000_000, 4 * 6_000_000), (4 * 2_000_000, 4 * 6_000_000))

    def predicted(backend, options, device="cpu", activations=ACTIVATIONS):
        training = _training(world_size=2, device=device)
        prediction = predict_memory(shape, backend, options, training, activations)
        step = next(part.bytes for part in prediction.parts if part.name == "optimizer step temporaries")
        return step, prediction.total() - prediction.model_state()

    assert predicted("ddp", {}) == (2 * 24_000_000, 2 * 24_000_000)  # the step makes more than 860 bytes
    assert predicted("ddp", {}, "cuda") == (32_000_000, 32_000_000)
    big = Activations(per_sample=10_000_000.0)
    assert predicted("ddp", {}, activations=big) == (48_000_000, 80_000_000)
    zero3 = {"zero_stage": 3, "zero_bucket_mb": 1.0}
    assert predicted("deepspeed", zero3)[0] == 3 * 16_000_000  # the slice's flattened gradients, Adam's two
    assert predicted("deepspeed", {**zero3, "zero_sub_group_mb": 2.0})[0] == 3 * 2 * MIB
    assert predicted("deepspeed", {**zero3, "zero_sub_group_mb": 2.0}, "cuda")[0] == 2 * 2 * MIB


def test_zero3_keeps_gathered_what_its_limit_allows_besides_the_module_at_work():
    """Under --zero-gathered-mb ZeRO-3 keeps the limit's worth of gathered weights (kept or
    prefetched) and the module at work, whole whatever its size; by default, every one."""
    shape = ModelShape(4 * 8_000_000, (4 * 2_000_000, 4 * 6_000_000), (4 * 2_000_000, 4 * 6_000_000))

    def gathered(options):
        prediction = predict_memory(shape, "deepspeed", options, _training(world_size=2), ACTIVATIONS)
        return next(part.bytes for part in prediction.parts if part.name == "gathered weights")

    zero3 = {"zero_stage": 3, "zero_bucket_mb": 1.0}
    assert gathered(zero3) == 4 * 8_000_000
    assert gathered({**zero3, "zero_gathered_mb": 4.0}) == 4 * MIB + 4 * 6_000_000
    assert gathered({**zero3, "zero_gathered_mb": 100.0}) == 4 * 8_000_000


def test_every_registered_backend_has_a_rule_and_says_why():
    for name, cls in BACKENDS.items():
        for options in cls.Options.examples():
            prediction = predict_memory(SHAPE, name, options, _training(), ACTIVATIONS)
            assert prediction.total("state") > 0 and len(prediction.assumptions) >= 3, name


@pytest.mark.parametrize(
    "backend, options, sharded",
    [
        ("ddp", {}, False),
        ("horovod", {}, False),
        ("deepspeed", {"zero_stage": 0}, False),
        ("deepspeed", {"zero_stage": 1}, True),
        ("deepspeed", {"zero_stage": 3}, True),
        ("fsdp", {}, True),
        ("fsdp", {"keep_gathered": True}, True),
    ],
)
def test_sharding_divides_the_sharded_parts_by_the_world_size(backend, options, sharded):
    shape = ModelShape(4 * 8_000_000, (4 * 2_000_000, 4 * 6_000_000), (4 * 2_000_000, 4 * 6_000_000))
    one, eight = (predict_memory(shape, backend, options, _training(world_size=n), ACTIVATIONS) for n in (1, 8))
    for name in ("optimizer", "gradients", "gradient slice", "float32 slice"):
        alone, shared = (
            next((part.bytes for part in prediction.parts if part.name == name), None) for prediction in (one, eight)
        )
        if alone is not None:
            step_counts = 4 * 4 if name == "optimizer" and backend == "fsdp" else 4 if name == "optimizer" else 0
            expected = (alone - step_counts) / 8 + step_counts if sharded else alone
            assert shared == pytest.approx(expected, abs=4), (name, alone, shared)
    assert one.total("activations") == eight.total("activations")


def test_an_evaluation_batch_larger_than_the_micro_batch_is_held_at_training_activations_per_sample():
    def activations(**changes) -> int:
        return predict_memory(SHAPE, "ddp", {}, _training(**changes), ACTIVATIONS).total("activations")

    assert activations(eval_batch=4) == activations() == ACTIVATIONS.at(8)
    assert activations(eval_batch=32) == ACTIVATIONS.at(32)


def test_sgd_keeps_momentum_only_when_it_has_momentum():
    def optimizer_bytes(momentum: float) -> int:
        training = _training(optimizer="sgd", momentum=momentum)
        return next(
            p.bytes for p in predict_memory(SHAPE, "ddp", {}, training, ACTIVATIONS).parts if p.name == "optimizer"
        )

    assert (optimizer_bytes(0.0), optimizer_bytes(0.9)) == (0, 4000)


def test_the_table_says_from_which_node_count_a_sharded_backend_fits():
    shape = ModelShape(4 * 10**9, (4 * 10**9,), (4 * 10**9,))  # 4 GB of float32 weights, one unit
    rows = memory_rows(shape, [("ddp", {}), ("fsdp", {})], _training(), Activations(0.0), [4, 8, 32])
    # DDP holds 4 x 4 GB with Adam at any size; FSDP 16 GB / N, the unit gathered and its gradients (8 GB)
    capacity = 11 * 10**9
    assert [fitting(per_size, [1, 2, 8], capacity) for _, per_size in rows] == ["does not fit", "fits from 2 nodes"]


def test_a_runs_record_holds_the_prediction_and_its_model_state_equals_the_counted_one():
    # The regression task has batch norm: its statistics are weights the prediction counts too.
    config = TrainConfig(
        task=f"{TASK_FILE}:regression",
        optimizer="adam",
        max_steps=4,
        timing_warmup_steps=2,  # the model state is counted in a warm-up step after the first
        batch_size=16,
        threads=1,
        eval_every=0,
        calibration_steps=0,
    )
    memory = train(config)["memory"]
    predicted = memory["predicted"]
    assert predicted["model_state_bytes"] == memory["model_state_bytes_per_rank"]["total"][0]
    assert predicted["model_state_error_per_rank"] == [0.0]
    assert predicted["parts"]["activations"] > 0 and predicted["peak_error_per_rank"][0] is not None
