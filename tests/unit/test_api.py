"""The Python API and the results record, in-process on the single-process backend."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os

import pytest
import torch

from harness import Callback, TrainConfig, UsageError, train
from harness.backends import BACKENDS
from harness.cli import show_progress
from harness.tasks.models import build_model
from tests.helpers.weights import load_weights

RECORD_FIELDS = {
    "backend",
    "world_size",
    "local_batch",
    "global_batch",
    "model",
    "dataset",
    "steps",
    "epochs",
    "lr_effective",
    "throughput",
    "throughput_per_worker",
    "epoch_times",
    "train_loss",
    "eval_loss",
    "eval_accuracy",
    "eval_samples",
    "versions",
    "config",
    "math",
    "au",
}


def test_train_returns_and_appends_a_complete_record(tmp_path):
    results, model_file = tmp_path / "r.jsonl", tmp_path / "m.pt"
    config = TrainConfig(max_steps=12, batch_size=32, results=str(results), save_model=str(model_file), threads=1)
    record = train(config)
    assert RECORD_FIELDS <= record.keys()
    assert (record["world_size"], record["global_batch"], record["steps"]) == (1, 32, 12)
    assert record["eval_samples"] == 297  # the whole digits test split, once
    assert record["timed_steps"] == 12 - record["timing_warmup_steps"] and record["throughput"] > 0
    assert record["math"]["gradient_clipping"] is None and record["math"]["gradient_averaging"] == "mean over ranks"
    assert record["memory"]["source"] == "rss_peak" and record["memory"]["peak_bytes_per_rank"][0] > 0
    assert record["versions"]["torch"] == torch.__version__
    lines = results.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["run_id"] == record["run_id"]
    assert TrainConfig.from_dict(record["config"]) == config
    state = load_weights(model_file)  # plain tensors only
    assert state.keys() == build_model("cnn", 1, 28, 10).state_dict().keys()


def test_training_on_digits_learns(tmp_path):
    record = train(TrainConfig(epochs=2, batch_size=32, lr=0.05, threads=1))
    assert record["eval_accuracy"] > 0.85, record["eval_accuracy"]
    assert record["train_losses"][1] < record["train_losses"][0]


def test_effective_lr_follows_the_scaling_rule():
    record = train(
        TrainConfig(
            max_steps=2, batch_size=32, base_batch=16, lr=0.1, lr_scaling="sqrt", threads=1, timing_warmup_steps=0
        )
    )
    assert record["lr_effective"] == pytest.approx(0.1 * 2**0.5)


def test_api_raises_usage_error_for_bad_config():
    with pytest.raises(UsageError, match="unknown backend 'nccl'"):
        train(TrainConfig(backend="nccl"))


@pytest.mark.parametrize("name", ["resnet18", "resnet50"])
def test_resnets_take_digits_and_synthetic_shapes(name):
    model = build_model(name, 1, 28, 10)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert sum(p.numel() for p in build_model("cnn", 1, 28, 10).parameters()) == 1_199_882


class Recorder(Callback):
    """Keeps what each event saw."""

    def __init__(self) -> None:
        self.steps, self.epochs, self.finished = [], [], []

    def on_step_end(self, event) -> None:
        self.steps.append((event.step, event.epoch, event.loss.item(), event.lr, event.samples))

    def on_epoch_end(self, event) -> None:
        self.epochs.append(event)

    def on_train_end(self, record) -> None:
        self.finished.append(record["run_id"])


def test_callbacks_see_every_step_and_epoch_and_the_history_is_exact():
    recorder = Recorder()
    # digits: 1,500 training images, batch 128 -> 11 steps per epoch, 22 in two epochs
    record = train(
        TrainConfig(
            epochs=2,
            batch_size=128,
            base_batch=64,
            lr=0.05,
            warmup_epochs=1,
            threads=1,
            eval_every=1,
            calibration_steps=0,
        ),
        callbacks=[recorder],
    )
    assert [step for step, *_ in recorder.steps] == list(range(1, 23))
    assert [epoch for _, epoch, *_ in recorder.steps] == [0] * 11 + [1] * 11
    assert [event.epoch for event in recorder.epochs] == [0, 1] and recorder.finished == [record["run_id"]]
    assert recorder.epochs[0].evaluation["eval_samples"] == 297
    history = record["history"]
    assert history["log_every"] == 1 and history["step"] == list(range(1, 23))
    # One process: the history's per-step losses are the losses the steps saw, and the LRs the warmup's.
    assert history["loss"] == pytest.approx([loss for _, _, loss, _, _ in recorder.steps], rel=1e-6)
    assert history["lr"] == pytest.approx([lr for *_, lr, _ in recorder.steps])
    assert history["lr"][0] == pytest.approx(0.05) and history["lr"][-1] == pytest.approx(0.1)
    # Epoch losses are the sample-weighted means of their steps.
    assert record["train_losses"] == pytest.approx([sum(history["loss"][:11]) / 11, sum(history["loss"][11:]) / 11])


def test_log_every_keeps_exact_block_means():
    record = train(TrainConfig(epochs=2, batch_size=128, threads=1, eval_every=0, calibration_steps=0, log_every=4))
    fine = train(TrainConfig(epochs=2, batch_size=128, threads=1, eval_every=0, calibration_steps=0))
    history, steps = record["history"], fine["history"]
    assert history["step"] == [4, 8, 12, 16, 20, 22]  # blocks span epochs; the last one is short
    means = [sum(steps["loss"][a:b]) / (b - a) for a, b in ((0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 22))]
    assert history["loss"] == pytest.approx(means, rel=1e-6)


def test_callbacks_must_be_callback_instances():
    with pytest.raises(TypeError, match="harness.Callback"):
        train(TrainConfig(max_steps=2), callbacks=[print])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_config_round_trips_through_json_and_the_cli_reads_it(tmp_path, backend):
    """Backend options included: the file's, with the option flags given beside it on top."""
    defaults, example = BACKENDS[backend].Options(), BACKENDS[backend].Options.examples()[-1]
    config = TrainConfig(
        backend=backend,
        task_args={"model": "cnn"},
        batch_size=32,
        tags={"lesson": "02"},
        warmup_epochs=0.5,
        backend_options=defaults.as_dict(),
    )
    path = tmp_path / "run.json"
    config.to_json(str(path))
    assert TrainConfig.from_json(str(path)) == config
    from harness.cli import build_parser
    from harness.training.flags import config_from_args

    saved = TrainConfig.from_json(str(path)).to_dict()
    args = build_parser(train_defaults=saved).parse_args(
        ["train", "--config", str(path), "--batch-size", "8", *example.to_flags()]
    )
    assert config_from_args(args) == TrainConfig(
        **{**config.to_dict(), "batch_size": 8, "backend_options": example.as_dict()}
    )


def test_help_lists_every_field_with_its_flag_and_meaning():
    import pydoc

    text = pydoc.render_doc(TrainConfig, renderer=pydoc.plaintext)
    for spec in dataclasses.fields(TrainConfig):
        flag = "a flag per option" if spec.metadata.get("backend_flags") else "--"
        assert f"{spec.name} ({flag}" in text, spec.name


def test_evaluate_appends_its_record_like_train_and_keeps_it_where_the_write_fails(tmp_path, monkeypatch, capsys):
    from harness import evaluate_model_file
    from harness.training import outputs

    model_file, results = tmp_path / "m.pt", tmp_path / "r.jsonl"
    trained = train(TrainConfig(max_steps=3, threads=1, save_model=str(model_file), calibration_steps=0))
    record = evaluate_model_file(TrainConfig(results=str(results), threads=1), str(model_file))
    assert record["eval_accuracy"] == trained["eval_accuracy"] and record["eval_samples"] == 297
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(lines) == 1 and lines[0]["kind"] == "evaluation" and lines[0]["eval_samples"] == 297
    # The results file fills its disk by the end: the record goes beside it, and one line says where.
    append = outputs.append_record

    def full_disk(path: str, entry: dict) -> None:
        if path == str(results):
            raise OSError(28, "No space left on device")
        append(path, entry)

    monkeypatch.setattr(outputs, "append_record", full_disk)
    capsys.readouterr()
    evaluate_model_file(TrainConfig(results=str(results), threads=1), str(model_file))
    kept = f"{results}.kept-{os.getpid()}"
    assert json.loads(open(kept).read())["kind"] == "evaluation" and len(results.read_text().splitlines()) == 1
    assert capsys.readouterr().err.strip() == (
        f"harness evaluate: warning: --results {results} could not be written ([Errno 28] No space left on device); "
        f"the run's record is kept in {kept}"
    )


@pytest.mark.parametrize(
    "config, message",
    [
        (TrainConfig(precision="fp8"), "unknown precision 'fp8'; choose one of fp32, bf16, fp16"),
        (TrainConfig(procs_per_gpu=2, device="cpu"), "--procs-per-gpu 2 places ranks on GPUs"),
        (TrainConfig(grad_accum=0), "--grad-accum must be a positive integer, got 0"),
        (TrainConfig(global_batch=64, grad_accum=3), "does not split evenly over 1 workers x 3 micro-batches"),
        (TrainConfig(backend_options={"zero_stage": 5}, backend="deepspeed"), "--zero-stage must be 0, 1, 2 or 3"),
        (TrainConfig(backend_options={"cycle_time_ms": 0}, backend="horovod"), "--hvd-cycle-time-ms must be positive"),
        (TrainConfig(backend_options={"bucket_cap_mb": -1}, backend="ddp"), "--ddp-bucket-cap-mb must be positive"),
        (TrainConfig(log_every=0), "--log-every must be a positive integer"),
    ],
)
def test_new_settings_are_checked_before_anything_runs(config, message):
    with pytest.raises(UsageError, match=message):
        train(config)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_an_unknown_backend_option_lists_the_backends_options(backend):
    names = [spec.name for spec in dataclasses.fields(BACKENDS[backend].Options)]
    known = f"its options are {', '.join(names)}" if names else "it has no options"
    with pytest.raises(UsageError, match=f"^backend '{backend}' has no option 'no_such_option'; {known}$"):
        train(TrainConfig(backend=backend, backend_options={"no_such_option": 1}))


def test_progress_lines_go_to_the_stdout_of_the_moment(monkeypatch):
    """Jupyter and pytest swap sys.stdout per cell or test: progress goes to the current one, never
    to a stream closed since the first run ("Logging error: I/O operation on closed file")."""
    logger = logging.getLogger("harness")
    monkeypatch.setattr(logger, "handlers", [])
    first, second = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(first):
        show_progress()
        logger.info("first cell")
    first.close()
    with contextlib.redirect_stdout(second):
        logger.info("second cell")
    assert second.getvalue() == "second cell\n"
