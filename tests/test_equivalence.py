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

from typing import Dict, List, Optional

import pytest
import torch

from harness.study.equivalence import BF16_UPDATE_BOUND, EQUIVALENCE_STEPS, UPDATE_BOUND, update_differences, worst
from harness.training.models import build_model
from harness.training.record import read_records

from .backend_cases import ALL, DISTRIBUTED, LauncherTurns, launcher_pairs, ranks, with_options
from .conftest import launch

LOCAL_BATCH = 16
COMMON = ["--model", "cnn", "--dataset", "digits", "--dropout", "0", "--seed", "0", "--lr-scaling", "none",
          "--max-steps", str(EQUIVALENCE_STEPS), "--threads", "1", "--eval-every", "0", "--calibration-steps", "0"]
OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
              "adam": ["--optimizer", "adam", "--lr", "0.001"]}
BF16 = ["--precision", "bf16"]
TURNS = LauncherTurns()


def _weights(path) -> Dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def _initial() -> Dict[str, torch.Tensor]:
    torch.manual_seed(0)  # the seed of COMMON: the weights training started from
    return build_model("cnn", 1, 28, 10, 0.0).state_dict()


def _difference(weights, reference) -> float:
    return worst(update_differences(weights, reference, _initial()))[1]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """Weights of the `none` baseline with the 2-rank global batch, per variant."""
    out = tmp_path_factory.mktemp("baseline")
    variants = {"sgd": OPTIMIZERS["sgd"], "adam": OPTIMIZERS["adam"],
                "sgd-clip": OPTIMIZERS["sgd"] + ["--grad-clip", "0.5"], "sgd-bf16": BF16 + OPTIMIZERS["sgd"]}
    weights = {}
    for name, flags in variants.items():
        path = out / f"{name}.pt"
        launch(1, "none", [*COMMON, *flags, "--batch-size", str(2 * LOCAL_BATCH), "--save-model", str(path)])
        weights[name] = _weights(path)
    return weights


def _train(tmp_path, backend: str, extra: List[str], ranks: int = 2, batch: int = LOCAL_BATCH,
           name: str = "model", launcher: Optional[str] = None) -> Dict[str, torch.Tensor]:
    path = tmp_path / f"{name}.pt"
    launch(ranks, backend, [*COMMON, *extra, "--batch-size", str(batch), "--save-model", str(path)], launcher)
    return _weights(path)


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_sgd_momentum_weights_match_single_process(tmp_path, single_process, backend, backend_flags, launcher):
    weights = _train(tmp_path, backend, OPTIMIZERS["sgd"] + backend_flags, launcher=launcher)
    name, value = worst(update_differences(weights, single_process["sgd"], _initial()))
    assert value <= UPDATE_BOUND, f"{backend}: {name} differs by {value:.3g} of its update"


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TURNS.cases(DISTRIBUTED))
def test_adam_weights_match_single_process(tmp_path, single_process, backend, launcher):
    weights = _train(tmp_path, backend, OPTIMIZERS["adam"], launcher=launcher)
    assert _difference(weights, single_process["adam"]) <= UPDATE_BOUND


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
    scaled = _train(tmp_path, "ddp", OPTIMIZERS["sgd"] + ["--lr-scaling", "linear", "--base-batch", str(LOCAL_BATCH)],
                    name="scaled")
    assert _difference(scaled, single_process["sgd"]) > 100 * UPDATE_BOUND


@pytest.fixture(scope="module")
def bf16_weights(tmp_path_factory):
    """Weights after bf16 training at 2 ranks, per backend, each computed once."""
    cache = {}

    def get(backend: str) -> Dict[str, torch.Tensor]:
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
    weights = _train(tmp_path, backend, OPTIMIZERS["sgd"] + ["--grad-accum", "2"], ranks=workers,
                     batch=2 * LOCAL_BATCH // (2 * workers), launcher=launcher)
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
    results = tmp_path / "compiled.jsonl"
    weights = _train(tmp_path, "ddp", OPTIMIZERS["sgd"] + ["--compile", "--results", str(results)])
    assert _difference(weights, single_process["sgd"]) <= UPDATE_BOUND
    record = read_records([str(results)])[0]
    assert record["tuning"]["compile"] == "torch.compile(DistributedDataParallel)"
    assert record["timing_warmup_steps"] >= 1  # the first step, which compiles, is outside the timed window


def test_the_runs_above_cover_every_backend_under_every_launcher():
    """Every pair the README lists ran a finished run here (the equivalence tests are slow; this
    checks, at collection, that they were given every pair)."""
    assert set(launcher_pairs()) <= TURNS.used, sorted(set(launcher_pairs()) - TURNS.used)
