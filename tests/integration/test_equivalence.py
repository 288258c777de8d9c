"""Backends at 2 ranks x batch b train the same weights as one process with batch 2b, on tasks the
kit does not ship (tests/helpers/tasks.py), reached by every rank as `--task FILE:FUNCTION`.

The cases are spread over the test tasks, each where it shows most:
- `auxiliary` (a head the loss skips every third step): SGD with momentum under every option set of
  every backend (ZeRO's stages and FSDP step the skipped parameters with a zero gradient, as one
  process does), and the two mistakes the bound must catch;
- `tokens` (token ids, a GRU, a loss averaged over the tokens; dropout off here): Adam under every
  option set, with the model state each rank holds and the evaluation at the end (its ranks' blocks
  take 2 and 1 batches), and gradient accumulation under every backend;
- `regression` (batch norm): clipping, bf16 and --compile. Each rank normalises by its own batch,
  so 2 ranks x b are one process taking the two ranks' samples as two micro-batches of b
  (--grad-accum 2) in rank order; the running statistics (buffers) stay each rank's own, so only
  parameters are compared, and the evaluation at the end (rank 0's buffers, each rank scoring its
  block of the test set) must equal `harness evaluate` of the saved model at one rank;
- the built-in `images` task's CNN: --channels-last, which reorders 4-D tensors only;
- the built-in `transformer` task (causal attention, LayerNorm, a loss over tokens; FSDP's units
  its embeddings, each block and its head): Adam under each backend's defaults, and its evaluation
  (the loss and the perplexity derived from it) at 2 ranks equal to the saved model's at one.

Compared relative to how far training moved each parameter, after harness.study.scaling.equivalence's 10
steps and within its bounds. The one-process references train in this process (harness.cli.main,
the `harness` command's function): no launcher is needed for one rank, and the `none` backend runs
under its own launcher in the accumulation case.

The runs take each backend's launchers in turn (LauncherTurns), so that together they also show
that the task reaches every rank, and that a finished run exits 0, under every backend and launcher
pair (conftest.launch asserts it): a finished run under mpirun once exited 1 (harness.cli.finalize_mpi).
"""

from __future__ import annotations

import contextlib
import io
from typing import Any, NamedTuple, Optional

import pytest
import torch

from harness.cli import main
from harness.study.scaling.equivalence import BF16_UPDATE_BOUND, EQUIVALENCE_STEPS, UPDATE_BOUND
from harness.training.memory import MODEL_STATE
from harness.training.record import read_records
from tests.conftest import launch
from tests.helpers import tasks
from tests.helpers.backend_cases import (
    ALL,
    DISTRIBUTED,
    LauncherTurns,
    for_unused_parameters,
    launcher_pairs,
    ranks,
    with_options,
)
from tests.helpers.weights import CNN, assert_evaluation_matches_one_rank, farthest_parameter, load_weights

LOCAL_BATCH = 16
COMMON = [
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
SGD = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]
ADAM = ["--optimizer", "adam", "--lr", "0.001"]
CLIP = ["--grad-clip", "0.5"]
BF16 = ["--precision", "bf16"]
TURNS = LauncherTurns()


class TaskCase(NamedTuple):
    """A task's flags, and how one process takes the 2 ranks' global batch."""

    flags: list[str]
    one_process: list[str]


WHOLE = ["--batch-size", str(2 * LOCAL_BATCH)]
BY_RANK = ["--batch-size", str(LOCAL_BATCH), "--grad-accum", "2"]  # batch norm's statistics per micro-batch
AUXILIARY = TaskCase(tasks.flags("auxiliary"), WHOLE)
TOKENS = TaskCase(tasks.flags("tokens", dropout=0), WHOLE)
REGRESSION = TaskCase(tasks.flags("regression"), BY_RANK)
IMAGES = TaskCase(CNN, WHOLE)
TRANSFORMER_SHAPE = ["--layers", "2", "--width", "32", "--heads", "4", "--sequence-length", "16"]
TRANSFORMER = TaskCase(["--task", "transformer", "--tokens", "synthetic", "--vocab", "32", *TRANSFORMER_SHAPE], WHOLE)
REFERENCES = {
    "auxiliary-sgd": (AUXILIARY, SGD),
    "tokens-sgd": (TOKENS, SGD),
    "tokens-adam": (TOKENS, ADAM),
    "regression-sgd": (REGRESSION, SGD),
    "regression-sgd-clip": (REGRESSION, SGD + CLIP),
    "regression-sgd-bf16": (REGRESSION, BF16 + SGD),
    "images-sgd": (IMAGES, SGD),
    "transformer-adam": (TRANSFORMER, ADAM),
}

Run = tuple[dict[str, torch.Tensor], dict[str, Any]]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """(weights, record) of one process with the 2-rank global batch, per REFERENCES key, each
    trained once, in this process."""
    cache: dict[str, Run] = {}

    def get(name: str) -> Run:
        if name not in cache:
            task, flags = REFERENCES[name]
            out = tmp_path_factory.mktemp(name)
            args = [*task.flags, *COMMON, *flags, *task.one_process]
            args += ["--save-model", str(out / "model.pt"), "--results", str(out / "results.jsonl")]
            with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
                assert main(["train", *args]) == 0
            cache[name] = load_weights(out / "model.pt"), read_records([str(out / "results.jsonl")])[0]
        return cache[name]

    return get


def _run(
    tmp_path,
    task: TaskCase,
    backend: str,
    extra: list[str],
    ranks: int = 2,
    batch: int = LOCAL_BATCH,
    name: str = "model",
    launcher: Optional[str] = None,
) -> Run:
    """(the weights, the record) of a run; its model is saved as `name`.pt."""
    path, results = tmp_path / f"{name}.pt", tmp_path / f"{name}.jsonl"
    args = [*task.flags, *COMMON, *extra, "--batch-size", str(batch), "--save-model", str(path)]
    launch(ranks, backend, [*args, "--results", str(results)], launcher)
    return load_weights(path), read_records([str(results)])[0]


def _assert_matches(task: TaskCase, weights, reference, bound: float = UPDATE_BOUND, what: str = "") -> None:
    name, value = farthest_parameter(weights, reference, task.flags + COMMON)
    assert value <= bound, f"{what}: {name} differs by {value:.3g} of its update (bound {bound})"


def _differs(task: TaskCase, weights, reference) -> float:
    return farthest_parameter(weights, reference, task.flags + COMMON)[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_sgd_momentum_weights_match_single_process(tmp_path, one_process, backend, backend_flags, launcher):
    """On `auxiliary`, whose auxiliary head gets no gradient every third step."""
    flags = for_unused_parameters(backend, SGD + backend_flags)
    weights, _ = _run(tmp_path, AUXILIARY, backend, flags, launcher=launcher)
    _assert_matches(AUXILIARY, weights, one_process("auxiliary-sgd")[0], what=f"{backend} {backend_flags}")


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_adam_weights_match_single_process(tmp_path, one_process, backend, backend_flags, launcher):
    """On `tokens`, under every option set (ZeRO's stages shard Adam's state, then the weights), with
    the evaluation at the end equal to the saved model's at one rank: ZeRO-3 and FSDP evaluate on
    their shards, the rank with one batch fewer running one forward more (uncounted) in step.
    Per rank, the weights, gradients and Adam's state are one process's (replicated), a half of them
    (sharded over the 2 ranks) or none (moved into the framework's own buffers, as ZeRO moves the
    averaged gradients); what the framework adds is printed (record: memory.model_state_bytes_per_rank).
    ZeRO-3 also keeps every parameter under 1e5 elements whole beside its partition (DeepSpeed's
    stage3_param_persistence_threshold), and every one of this small model's is: its weights are
    one process's and a half again (measured: 31.0 of 20.7 kB)."""
    weights, record = _run(tmp_path, TOKENS, backend, ADAM + backend_flags, launcher=launcher)
    reference, alone_record = one_process("tokens-adam")
    _assert_matches(TOKENS, weights, reference, what=f"{backend} {backend_flags}")
    assert_evaluation_matches_one_rank(record, tmp_path / "model.pt", TOKENS.flags)
    alone = alone_record["memory"]["model_state_bytes_per_rank"]
    state = record["memory"]["model_state_bytes_per_rank"]
    print(
        f"{backend} {' '.join(backend_flags)}: model state per rank (kB) "
        + ", ".join(
            f"{part} {state[part][0] / 1e3:.1f} of one process's {alone[part][0] / 1e3:.1f}" for part in MODEL_STATE
        )
    )
    for part in ("weights", "gradients", "optimizer"):
        shares = [value / alone[part][0] for value in state[part]]
        expected_shares = (1.0, 0.5, 0.0, 1.5) if part == "weights" else (1.0, 0.5, 0.0)
        assert any(
            all(share == pytest.approx(expected, abs=0.02) for share in shares) for expected in expected_shares
        ), f"{backend} {backend_flags}: {part} per rank {shares} of one process's"


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TURNS.cases(DISTRIBUTED))
def test_builtin_transformer_weights_match_single_process(tmp_path, one_process, backend, launcher):
    weights, record = _run(tmp_path, TRANSFORMER, backend, ADAM, launcher=launcher)
    _assert_matches(TRANSFORMER, weights, one_process("transformer-adam")[0], what=backend)
    assert_evaluation_matches_one_rank(record, tmp_path / "model.pt", TRANSFORMER.flags)


@pytest.mark.slow
def test_zero3_evaluates_on_its_shards_with_the_ranks_in_step(tmp_path):
    """ZeRO-3 gathers a module's weights inside its forward once it holds more than 1e5 elements (the
    `tokens` model's never do): at width 192 the blocks' linear layers do, and with --zero-gathered-mb
    0.25 it frees them after use (by default a model this small stays gathered after one forward).
    Its 9 test windows are blocks of 5 and 4 at 2 ranks, batches of 4: one rank evaluates 2 batches,
    the other 1 and one forward more, uncounted, in step (without it, rank 0 waits in its second
    forward's all-gather until --timeout)."""
    task = TaskCase([*TRANSFORMER.flags, "--width", "192", "--test-windows", "9"], WHOLE)
    _, record = _run(tmp_path, task, "deepspeed", ["--zero-stage", "3", "--zero-gathered-mb", "0.25", *ADAM], batch=4)
    assert record["eval_samples"] == 9
    assert_evaluation_matches_one_rank(record, tmp_path / "model.pt", task.flags)


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TURNS.cases(DISTRIBUTED))
def test_gradient_clipping_is_applied_identically(tmp_path, one_process, backend, launcher):
    """On `regression`; its evaluation at 2 ranks, with rank 0's batch-norm statistics, equals the
    saved model's at one rank."""
    weights, record = _run(tmp_path, REGRESSION, backend, SGD + CLIP, launcher=launcher)
    _assert_matches(REGRESSION, weights, one_process("regression-sgd-clip")[0], what=backend)
    # Clipping at 0.5 really changes this run: had a backend not clipped, the bound would see it.
    assert (
        _differs(REGRESSION, one_process("regression-sgd")[0], one_process("regression-sgd-clip")[0])
        > 100 * UPDATE_BOUND
    )
    assert_evaluation_matches_one_rank(record, tmp_path / "model.pt", REGRESSION.flags)


@pytest.mark.slow
def test_the_bound_catches_deepspeeds_default_clipping_and_a_doubled_lr(tmp_path, one_process):
    """DeepSpeed's default (clip at norm 1.0), and linear LR scaling against an unscaled reference, are
    different experiments; the comparison must say so (on `auxiliary`)."""
    reference = one_process("auxiliary-sgd")[0]
    clipped, _ = _run(tmp_path, AUXILIARY, "deepspeed", SGD + ["--grad-clip", "1.0"], name="clipped")
    assert _differs(AUXILIARY, clipped, reference) > 100 * UPDATE_BOUND
    scaled_lr = for_unused_parameters("ddp", SGD + ["--lr-scaling", "linear", "--base-batch", str(LOCAL_BATCH)])
    scaled, _ = _run(tmp_path, AUXILIARY, "ddp", scaled_lr, name="scaled")
    assert _differs(AUXILIARY, scaled, reference) > 100 * UPDATE_BOUND


@pytest.fixture(scope="module")
def bf16_weights(tmp_path_factory):
    """Weights after bf16 training on `regression` at 2 ranks, per backend, each computed once."""
    cache = {}

    def get(backend: str) -> dict[str, torch.Tensor]:
        if backend not in cache:
            out = tmp_path_factory.mktemp(f"{backend}-bf16")
            cache[backend] = _run(out, REGRESSION, backend, BF16 + SGD)[0]
        return cache[backend]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("backend", DISTRIBUTED)
def test_bf16_autocast_matches_single_process_within_bf16_precision(one_process, bf16_weights, backend):
    weights = bf16_weights(backend)
    assert all(value.dtype == torch.float32 for value in weights.values() if value.is_floating_point())
    _assert_matches(REGRESSION, weights, one_process("regression-sgd-bf16")[0], BF16_UPDATE_BOUND, f"{backend} bf16")
    # Every backend splits the batch alike, so they agree with each other as in float32 ...
    _assert_matches(REGRESSION, weights, bf16_weights(DISTRIBUTED[0]), what=f"{backend} against {DISTRIBUTED[0]}")
    # ... and bf16 really ran: float32 training lands elsewhere.
    assert (
        _differs(REGRESSION, one_process("regression-sgd")[0], one_process("regression-sgd-bf16")[0])
        > 10 * UPDATE_BOUND
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend, launcher", TURNS.cases(ALL))
def test_gradient_accumulation_matches_one_large_batch(tmp_path, one_process, backend, launcher):
    """On `tokens`: 2 ranks x 2 micro-batches x 8 sequences (or 1 process x 2 x 16) take the steps
    of one process x 32, the loss averaged over every token of the global batch."""
    workers = ranks(backend)
    weights, _ = _run(
        tmp_path,
        TOKENS,
        backend,
        SGD + ["--grad-accum", "2"],
        ranks=workers,
        batch=2 * LOCAL_BATCH // (2 * workers),
        launcher=launcher,
    )
    _assert_matches(TOKENS, weights, one_process("tokens-sgd")[0], what=f"{backend} x{workers}")


@pytest.mark.slow
@pytest.mark.parametrize("backend, backend_flags, launcher", with_options(turns=TURNS))
def test_channels_last_weights_match_single_process(tmp_path, one_process, backend, backend_flags, launcher):
    # DeepSpeed broadcasts weights as raw bytes, which a channels-last weight cannot give (seen
    # on a GPU first); every backend must train channels-last models as it trains plain ones.
    weights, _ = _run(tmp_path, IMAGES, backend, SGD + backend_flags + ["--channels-last"], launcher=launcher)
    _assert_matches(IMAGES, weights, one_process("images-sgd")[0], what=f"{backend} {backend_flags}")


@pytest.mark.slow
def test_compiled_ddp_weights_match_single_process(tmp_path, one_process):
    """--compile under DDP (torch.compile of the wrapped model, inductor's C++ kernels on the CPU)
    trains the reference's weights within the bound on `regression`: compiled kernels only reorder
    float sums, batch norm's included."""
    weights, record = _run(tmp_path, REGRESSION, "ddp", SGD + ["--compile"])
    _assert_matches(REGRESSION, weights, one_process("regression-sgd")[0], what="compiled ddp")
    assert record["tuning"]["compile"] == "torch.compile(DistributedDataParallel)"
    assert record["timing_warmup_steps"] >= 1  # the first step, which compiles, is outside the timed window
    assert_evaluation_matches_one_rank(record, tmp_path / "model.pt", REGRESSION.flags)


def test_the_runs_above_cover_every_backend_under_every_launcher():
    """Every pair docs/reference/backends.md lists ran a finished run here (the equivalence tests are slow; this
    checks, at collection, that they were given every pair)."""
    assert set(launcher_pairs()) <= TURNS.used, sorted(set(launcher_pairs()) - TURNS.used)
