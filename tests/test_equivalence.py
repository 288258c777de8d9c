"""Backends at 2 ranks x batch b train the same weights as one process with batch 2b.

Compared relative to how far training moved each tensor, after harness.study.equivalence's 10 steps and
within its bounds (that module's docstring has the measurements behind them). Each test also
asserts that the mistake it guards against would land far outside the bound, so the bound is not
merely loose: DeepSpeed's default gradient clipping and a learning rate scaled otherwise than the
reference's are run here on purpose.

The runs take each backend's launchers in turn (LauncherTurns), so that together they also show
that a finished run exits 0 under every backend and launcher pair (conftest.launch asserts it):
a finished run under mpirun once exited 1 (harness.cli.finalize_mpi).
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from harness.study.equivalence import BF16_UPDATE_BOUND, EQUIVALENCE_STEPS, UPDATE_BOUND, update_differences, worst
from harness.training.memory import MODEL_STATE
from harness.training.models import build_model
from harness.training.record import read_records

from .backend_cases import ALL, DISTRIBUTED, LauncherTurns, launcher_pairs, ranks, with_options
from .conftest import launch

LOCAL_BATCH = 16
COMMON = [
    "--model",
    "cnn",
    "--dataset",
    "digits",
    "--dropout",
    "0",
    "--seed",
    "0",
    "--lr-scaling",
    "none",
    "--max-steps",
    str(EQUIVALENCE_STEPS),
    "--threads",
    "1",
    "--eval-every",
    "0",
    "--calibration-steps",
    "0",
]
OPTIMIZERS = {
    "sgd": ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
    "adam": ["--optimizer", "adam", "--lr", "0.001"],
}
BF16 = ["--precision", "bf16"]
TURNS = LauncherTurns()


def _weights(path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _initial() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)  # the seed of COMMON: the weights training started from
    return build_model("cnn", 1, 28, 10, 0.0).state_dict()


def _difference(weights, reference) -> float:
    return worst(update_differences(weights, reference, _initial()))[1]


@pytest.fixture(scope="module")
def single_process_runs(tmp_path_factory) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, dict[str, Any]]]:
    """Weights and record of the `none` baseline with the 2-rank global batch, per variant."""
    out = tmp_path_factory.mktemp("baseline")
    variants = {
        "sgd": OPTIMIZERS["sgd"],
        "adam": OPTIMIZERS["adam"],
        "sgd-clip": OPTIMIZERS["sgd"] + ["--grad-clip", "0.5"],
        "sgd-bf16": BF16 + OPTIMIZERS["sgd"],
    }
    weights, records = {}, {}
    for name, flags in variants.items():
        weights[name], records[name] = _run(out, "none", flags, ranks=1, batch=2 * LOCAL_BATCH, name=name)
    return weights, records


@pytest.fixture(scope="module")
def single_process(single_process_runs) -> dict[str, dict[str, torch.Tensor]]:
    """Weights of the `none` baseline with the 2-rank global batch, per variant."""
    return single_process_runs[0]


def _run(
    tmp_path,
    backend: str,
    extra: list[str],
    ranks: int = 2,
    batch: int = LOCAL_BATCH,
    name: str = "model",
    launcher: Optional[str] = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the weights, the record) of a run."""
    path, results = tmp_path / f"{name}.pt", tmp_path / f"{name}.jsonl"
    launch(
        ranks,
        backend,
        [*COMMON, *extra, "--batch-size", str(batch), "--save-model", str(path), "--results", str(results)],
        launcher,
    )
    return _weights(path), read_records([str(results)])[0]


def _train(
    tmp_path,
    backend: str,
    extra: list[str],
    ranks: int = 2,
    batch: int = LOCAL_BATCH,
    name: str = "model",
    launcher: Optional[str] = None,
) -> dict[str, torch.Tensor]:
    return _run(tmp_path, backend, extra, ranks, batch, name, launcher)[0]


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_sgd_momentum_weights_match_single_process(tmp_path, single_process, backend, backend_flags, launcher):
    weights = _train(tmp_path, backend, OPTIMIZERS["sgd"] + backend_flags, launcher=launcher)
    name, value = worst(update_differences(weights, single_process["sgd"], _initial()))
    assert value <= UPDATE_BOUND, f"{backend}: {name} differs by {value:.3g} of its update"


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_adam_weights_match_single_process(tmp_path, single_process_runs, backend, backend_flags, launcher):
    """The same weights under every option set (ZeRO's stages shard Adam's state, then the weights).
    Per rank, the weights, gradients and Adam's state are one process's (replicated), a half of them
    (sharded over the 2 ranks) or none (moved into the framework's own buffers, as ZeRO moves the
    averaged gradients); what the framework adds is printed (record: memory.model_state_bytes_per_rank)."""
    weights, record = _run(tmp_path, backend, OPTIMIZERS["adam"] + backend_flags, launcher=launcher)
    assert _difference(weights, single_process_runs[0]["adam"]) <= UPDATE_BOUND
    alone = single_process_runs[1]["adam"]["memory"]["model_state_bytes_per_rank"]
    state = record["memory"]["model_state_bytes_per_rank"]
    print(
        f"{backend} {' '.join(backend_flags)}: model state per rank (MB) "
        + ", ".join(
            f"{part} {state[part][0] / 1e6:.2f} of one process's {alone[part][0] / 1e6:.2f}" for part in MODEL_STATE
        )
    )
    for part in ("weights", "gradients", "optimizer"):
        shares = [value / alone[part][0] for value in state[part]]
        assert any(
            all(share == pytest.approx(expected, abs=0.02) for share in shares) for expected in (1.0, 0.5, 0.0)
        ), f"{backend} {backend_flags}: {part} per rank {shares} of one process's"


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TURNS.cases(DISTRIBUTED))
def test_gradient_clipping_is_applied_identically(tmp_path, single_process, backend, launcher):
    weights = _train(tmp_path, backend, OPTIMIZERS["sgd"] + ["--grad-clip", "0.5"], launcher=launcher)
    assert _difference(weights, single_process["sgd-clip"]) <= UPDATE_BOUND
    # Clipping at 0.5 really changes this run: had a backend not clipped, the bound would see it.
    assert _difference(single_process["sgd"], single_process["sgd-clip"]) > 100 * UPDATE_BOUND


@pytest.mark.slow
def test_the_bound_catches_deepspeeds_default_clipping_and_a_doubled_lr(tmp_path, single_process):
    """DeepSpeed's default (clip at norm 1.0), and linear LR scaling against an unscaled reference, are
    different experiments; the comparison must say so."""
    clipped = _train(tmp_path, "deepspeed", OPTIMIZERS["sgd"] + ["--grad-clip", "1.0"], name="clipped")
    assert _difference(clipped, single_process["sgd"]) > 100 * UPDATE_BOUND
    scaled = _train(
        tmp_path,
        "ddp",
        OPTIMIZERS["sgd"] + ["--lr-scaling", "linear", "--base-batch", str(LOCAL_BATCH)],
        name="scaled",
    )
    assert _difference(scaled, single_process["sgd"]) > 100 * UPDATE_BOUND


@pytest.fixture(scope="module")
def bf16_weights(tmp_path_factory):
    """Weights after bf16 training at 2 ranks, per backend, each computed once."""
    cache = {}

    def get(backend: str) -> dict[str, torch.Tensor]:
        if backend not in cache:
            cache[backend] = _train(tmp_path_factory.mktemp(f"{backend}-bf16"), backend, BF16 + OPTIMIZERS["sgd"])
        return cache[backend]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_bf16_autocast_matches_single_process_within_bf16_precision(single_process, bf16_weights, backend):
    weights = bf16_weights(backend)
    assert all(value.dtype == torch.float32 for value in weights.values())  # float32 weights under autocast
    name, value = worst(update_differences(weights, single_process["sgd-bf16"], _initial()))
    assert value <= BF16_UPDATE_BOUND, f"{backend}: {name} differs by {value:.3g} of its update in bf16"
    # Every backend splits the batch alike, so they agree with each other as in float32 ...
    assert _difference(weights, bf16_weights(DISTRIBUTED[0])) <= UPDATE_BOUND
    # ... and bf16 really ran: float32 training lands elsewhere.
    assert _difference(single_process["sgd"], single_process["sgd-bf16"]) > 10 * UPDATE_BOUND


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TURNS.cases(ALL))
def test_gradient_accumulation_matches_one_large_batch(tmp_path, single_process, backend, launcher):
    """2 ranks x 2 micro-batches x 8 (or 1 process x 2 x 16) take the steps of one process x 32."""
    workers = ranks(backend)
    weights = _train(
        tmp_path,
        backend,
        OPTIMIZERS["sgd"] + ["--grad-accum", "2"],
        ranks=workers,
        batch=2 * LOCAL_BATCH // (2 * workers),
        launcher=launcher,
    )
    assert _difference(weights, single_process["sgd"]) <= UPDATE_BOUND


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_channels_last_weights_match_single_process(tmp_path, single_process, backend, backend_flags, launcher):
    # DeepSpeed broadcasts weights as raw bytes, which a channels-last weight cannot give (seen
    # on a GPU first); every backend must train channels-last models as it trains plain ones.
    weights = _train(tmp_path, backend, OPTIMIZERS["sgd"] + backend_flags + ["--channels-last"], launcher=launcher)
    assert _difference(weights, single_process["sgd"]) <= UPDATE_BOUND


@pytest.mark.slow
def test_compiled_ddp_weights_match_single_process(tmp_path, single_process):
    """--compile under DDP (torch.compile of the wrapped model, inductor's C++ kernels on the CPU)
    trains the reference's weights within the bound: compiled kernels only reorder float sums."""
    weights, record = _run(tmp_path, "ddp", OPTIMIZERS["sgd"] + ["--compile"])
    assert _difference(weights, single_process["sgd"]) <= UPDATE_BOUND
    assert record["tuning"]["compile"] == "torch.compile(DistributedDataParallel)"
    assert record["timing_warmup_steps"] >= 1  # the first step, which compiles, is outside the timed window


def test_the_runs_above_cover_every_backend_under_every_launcher():
    """Every pair docs/reference/backends.md lists ran a finished run here (the equivalence tests are slow; this
    checks, at collection, that they were given every pair)."""
    assert set(launcher_pairs()) <= TURNS.used, sorted(set(launcher_pairs()) - TURNS.used)
