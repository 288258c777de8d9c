"""The built-in `transformer` task: its size from its flags, a causal model, exact token windows of
deterministic data, one-line refusals before a run, and a short run in this process that learns."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch

from harness import TrainConfig, train
from harness.cli import main
from harness.data.tokens import (
    BRANCHES,
    SYNTHETIC_WINDOWS,
    TokenWindows,
    corpus_files,
    corpus_windows,
    is_test_document,
    prepare_corpus,
    synthetic_windows,
)
from harness.errors import UsageError
from harness.tasks.loading import load_task
from harness.tasks.transformer import DecoderTransformer, TransformerOptions, parameter_count
from harness.training.flags import parse_train_flags

TRAIN = ["train", "--batch-size", "8", "--max-steps", "1", "--threads", "1", "--calibration-steps", "0"]


def _counted_on_meta(options: TransformerOptions) -> int:
    with torch.device("meta"):  # shapes only: a billion parameters allocate nothing
        model = DecoderTransformer(options)
    return sum(parameter.numel() for parameter in model.parameters())


@pytest.mark.parametrize(
    "shape, low, high",
    [
        ({}, 0.8e6, 1.2e6),  # the defaults: about 1M
        ({"layers": 2, "width": 64, "heads": 2, "sequence_length": 32}, 1e5, 2e5),
        (
            {"layers": 12, "width": 768, "heads": 12, "sequence_length": 1024, "tokens": "synthetic", "vocab": 50257},
            124_439_808 + 50257 * 768,  # GPT-2 small (its head tied: 124,439,808) with a head of its own
            124_439_808 + 50257 * 768,
        ),
        ({"layers": 24, "width": 2048, "heads": 16, "sequence_length": 1024}, 1e9, 1.3e9),
    ],
)
def test_parameter_count_spans_a_million_to_a_billion(shape, low, high):
    options = TransformerOptions(**shape)
    assert low <= parameter_count(options) <= high
    assert _counted_on_meta(options) == parameter_count(options)


def test_a_later_token_changes_no_earlier_logit():
    torch.manual_seed(0)
    model = DecoderTransformer(TransformerOptions(layers=2, width=32, heads=4, sequence_length=16)).eval()
    tokens = torch.randint(0, 256, (2, 16))
    changed = tokens.clone()
    changed[:, 10] = (tokens[:, 10] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_dropout_draws_in_training_only(dropout):
    torch.manual_seed(0)
    model = DecoderTransformer(TransformerOptions(layers=1, width=16, heads=2, sequence_length=8, dropout=dropout))
    tokens = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        assert torch.equal(model(tokens), model(tokens)) == (dropout == 0)
        model.eval()
        assert torch.equal(model(tokens), model(tokens))


def test_windows_are_the_stream_and_the_stream_shifted_by_one(tmp_path):
    path = str(tmp_path / "tokens.npy")
    np.save(path, np.arange(23, dtype=np.uint8))
    windows = TokenWindows(path, sequence_length=5)
    assert len(windows) == 4  # (23 - 1) // 5: the last window's final target is token 20
    inputs, targets = windows.fetch(np.array([3, 0]))
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.tolist() == [[15, 16, 17, 18, 19], [0, 1, 2, 3, 4]]
    assert targets.tolist() == [[16, 17, 18, 19, 20], [1, 2, 3, 4, 5]]


def test_synthetic_tokens_are_the_same_windows_by_index_and_follow_the_chain():
    first, again = synthetic_windows(24, 64), synthetic_windows(24, 64)
    assert {split: len(data) for split, data in first.items()} == SYNTHETIC_WINDOWS
    rows = np.array([7, 3, 59_999])
    inputs, targets = first["train"].fetch(rows)
    assert torch.equal(inputs, again["train"].fetch(rows)[0])
    assert torch.equal(inputs[1], first["train"].fetch(np.array([3]))[0][0])  # a window is its index's alone
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and int(inputs.max()) < 64
    assert not torch.equal(inputs, first["test"].fetch(rows)[0])
    successors = first["train"].successors
    assert successors.shape == (64, BRANCHES)
    assert all(int(target) in successors[int(token)] for token, target in zip(inputs.flatten(), targets.flatten()))


def test_fewer_synthetic_test_windows_are_the_first_of_the_default_ones():
    task = load_task("transformer", {"tokens": "synthetic", "sequence_length": 16, "test_windows": 8}).task
    default = load_task("transformer", {"tokens": "synthetic", "sequence_length": 16}).task
    assert len(task.test_data) == 8 and len(task.train_data) == SYNTHETIC_WINDOWS["train"]
    rows = np.arange(8)
    assert torch.equal(task.test_data.fetch(rows)[0], default.test_data.fetch(rows)[0])


def _library(root) -> list[str]:
    """Write a small standard library into `root`; its files that are the corpus, in order (a test
    suite, site-packages and a file that is not Python are left out)."""
    files = {
        "abc.py": b"'''abc'''\n",
        "json/__init__.py": b"import json.decoder\n",
        "json/decoder.py": b"def decode(s):\n    return s\n",
        "zipfile.py": b"# zip\n",
        "test/test_abc.py": b"left out\n",
        "site-packages/pkg.py": b"left out\n",
        "notes.txt": b"left out\n",
    }
    for name, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        with open(os.path.join(root, name), "wb") as handle:
            handle.write(text)
    return ["abc.py", "json/__init__.py", "json/decoder.py", "zipfile.py"]


def test_the_corpus_is_the_library_in_path_order_split_by_path(tmp_path, capsys):
    root = str(tmp_path / "lib")
    expected_files = [os.path.normpath(name) for name in _library(root)]
    assert corpus_files(root) == expected_files
    directory = prepare_corpus(str(tmp_path / "data"), timeout=10, root=root)
    assert "preparing the token corpus" in capsys.readouterr().out
    assert prepare_corpus(str(tmp_path / "data"), timeout=10, root=root) == directory  # found, not written again
    assert "preparing" not in capsys.readouterr().out
    streams = {split: np.load(os.path.join(directory, f"{split}_tokens.npy")).tobytes() for split in ("train", "test")}
    expected = {"train": b"", "test": b""}
    for relative in corpus_files(root):
        with open(os.path.join(root, relative), "rb") as handle:
            expected["test" if is_test_document(relative) else "train"] += handle.read() + b"\0"
    assert streams == expected
    # Another data directory prepares the same bytes under the same name.
    other = prepare_corpus(str(tmp_path / "other"), timeout=10, root=root)
    assert os.path.basename(other) == os.path.basename(directory)
    assert np.load(os.path.join(other, "train_tokens.npy")).tobytes() == streams["train"]


def test_the_split_is_fixed_by_the_path():
    names = [f"module{index}.py" for index in range(400)]
    tested = [name for name in names if is_test_document(name)]
    assert tested == [name for name in names if is_test_document(name)]
    assert 5 <= len(tested) <= 40  # about one in 20


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> str:
    """A data directory holding the prepared corpus of this Python's standard library."""
    data_dir = str(tmp_path_factory.mktemp("tokens"))
    prepare_corpus(data_dir, timeout=60)
    return data_dir


def test_the_task_trains_on_the_byte_corpus(corpus_dir):
    loaded = load_task("transformer", {"data_dir": corpus_dir, "sequence_length": 64})
    task = loaded.task
    assert loaded.builtin and loaded.args["tokens"] == "corpus" and loaded.args["layers"] == 4
    assert task.description["data"] == "stdlib-bytes"
    assert task.description["tokens"].startswith(f"stdlib-bytes-py{sys.version_info.major}.{sys.version_info.minor}-")
    assert len(task.train_data) > 10 * len(task.test_data) > 0
    inputs, targets = task.train_data.fetch(np.arange(4))
    assert inputs.shape == targets.shape == (4, 64) and torch.equal(inputs[:, 1:], targets[:, :-1])
    text = bytes(inputs[0].tolist())
    assert text.isascii() or text.decode("utf-8", "ignore")  # Python source, read as bytes


@pytest.mark.parametrize(
    "args, message",
    [
        ({"width": 128, "heads": 3}, "--heads 3 does not divide --width 128; choose --heads from 1, 2, 4, 8"),
        ({"tokens": "words"}, "unknown --tokens 'words'"),
        ({"vocab": 1000}, "--vocab sets the synthetic tokens' vocabulary; drop it"),
        ({"layers": 0}, "--layers must be a positive integer"),
        ({"dropout": 1.0}, "--transformer-dropout must be in [0, 1)"),
        ({"test_windows": 8}, "--test-windows sets the synthetic tokens' held-out windows; drop it"),
        ({"tokens": "synthetic", "test_windows": 0}, "--test-windows must be a positive integer"),
    ],
)
def test_a_malformed_argument_is_one_line_naming_the_flag(args, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_task("transformer", args)


def test_a_sequence_longer_than_the_test_split_is_refused_with_the_longest_that_fits(corpus_dir, capsys):
    test_tokens = len(corpus_windows(corpus_dir, 64, timeout=10)["test"].tokens)
    flags = ["--task", "transformer", "--tokens-dir", corpus_dir, "--sequence-length", str(test_tokens)]
    assert main([*TRAIN, *flags]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert f"use --sequence-length {test_tokens - 1} or less" in lines[0]


def test_each_tasks_flags_are_refused_beside_the_other_task():
    with pytest.raises(
        UsageError, match="--layers is an argument of task transformer; drop it or use --task transformer"
    ):
        parse_train_flags(["--layers", "2"])  # the images task, the default
    with pytest.raises(UsageError, match="--model is an argument of task images"):
        parse_train_flags(["--task", "transformer", "--model", "cnn"])
    config = parse_train_flags(["--task", "transformer", "--width", "64", "--transformer-dropout", "0.1"])
    assert config.task_args == {"width": 64, "dropout": 0.1}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_a_short_run_on_synthetic_tokens_lowers_the_loss(tmp_path, dropout):
    vocab = 32
    config = TrainConfig(
        task="transformer",
        task_args={
            "tokens": "synthetic",
            "vocab": vocab,
            "layers": 2,
            "width": 32,
            "heads": 2,
            "sequence_length": 16,
            "dropout": dropout,
        },
        batch_size=16,
        max_steps=40,
        optimizer="adam",
        lr=0.01,
        threads=1,
        calibration_steps=0,
        results=str(tmp_path / "results.jsonl"),
    )
    record = train(config)
    # From log(vocab) at the start towards log(BRANCHES), the chain's own entropy: past halfway.
    assert record["eval_loss"] < (math.log(vocab) + math.log(BRANCHES)) / 2
    assert record["eval_perplexity"] == pytest.approx(math.exp(record["eval_loss"]))
    assert record["task"]["parameters"] == parameter_count(TransformerOptions(**config.task_args))
    assert record["dataset"] == "synthetic-tokens" and record["model"] == "transformer-2x32"
