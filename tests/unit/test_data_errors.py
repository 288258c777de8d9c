"""Bad data input: one line naming the fix, exit status 2, and no prepared files left behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

from harness.cli import main
from tests.helpers.cli import run_cli
from tests.helpers.data_files import random_mnist, write_cifar10, write_image_tree, write_mnist
from tests.helpers.unprivileged import as_unprivileged_user, searchable_tmp_dir


def one_line_error(capsys, argv) -> str:
    """Run `harness ARGV` in-process; assert exit status 2 and a single stderr line, and return it."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def assert_nothing_prepared(data_dir) -> None:
    root = os.path.join(data_dir, "prepared")
    assert not os.path.exists(root) or os.listdir(root) == [], os.listdir(root)  # no scratch, lock or output


def test_missing_files_name_the_path_and_the_download_command(tmp_path, capsys):
    line = one_line_error(capsys, ["data", "prepare", "mnist", "--data-dir", str(tmp_path)])
    expected = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    assert f"expected {expected}, which does not exist" in line
    assert f"`harness data download mnist --data-dir {tmp_path}`" in line
    line = one_line_error(capsys, ["data", "prepare", "cifar10", "--data-dir", str(tmp_path)])
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_1") in line and "harness data download cifar10" in line
    assert_nothing_prepared(tmp_path)


def test_training_on_missing_files_fails_before_any_rank_work(tmp_path, capsys):
    status, lines = run_cli(capsys, ["train", "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)])
    assert status == 2
    (line,) = lines
    assert str(tmp_path / "FashionMNIST" / "raw") in line and "harness data download fashion-mnist" in line


def test_truncated_idx_file(tmp_path, capsys):
    random_mnist(str(tmp_path), 20, 5)
    labels = tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-2])
    line = one_line_error(capsys, ["data", "prepare", "mnist", "--data-dir", str(tmp_path)])
    assert "t10k-labels-idx1-ubyte is truncated" in line and "harness data download mnist" in line
    assert_nothing_prepared(tmp_path)


def test_corrupt_cifar_batch(tmp_path, capsys):
    write_cifar10(str(tmp_path), per_batch=2)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02}q\x00")
    line = one_line_error(capsys, ["data", "prepare", "cifar10", "--data-dir", str(tmp_path)])
    assert "test_batch is not a CIFAR python batch" in line
    assert_nothing_prepared(tmp_path)


def test_empty_image_tree(tmp_path, capsys):
    (tmp_path / "train" / "cat").mkdir(parents=True)
    (tmp_path / "val" / "cat").mkdir(parents=True)
    line = one_line_error(capsys, ["data", "prepare", "imagefolder", "--data-dir", str(tmp_path)])
    assert f"no images under {tmp_path / 'train'}" in line
    assert_nothing_prepared(tmp_path)


def test_an_undecodable_image_after_many_good_ones_leaves_nothing_behind(tmp_path, capsys):
    write_image_tree(str(tmp_path / "train"), ["a", "b"], per_class=3)
    write_image_tree(str(tmp_path / "val"), ["a", "b"], per_class=1)
    (tmp_path / "val" / "b" / "zz.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    line = one_line_error(capsys, ["data", "prepare", "imagefolder", "--data-dir", str(tmp_path), "--image-size", "8"])
    assert "cannot decode" in line and "zz.jpg" in line
    assert_nothing_prepared(tmp_path)


def test_unwritable_data_dir(tmp_path, capsys):
    random_mnist(str(tmp_path), 20, 5)
    # Root may write anywhere, so block the output path in a way that stops root too.
    (tmp_path / "prepared").write_text("a file where the prepared directory should be")
    line = one_line_error(capsys, ["data", "prepare", "mnist", "--data-dir", str(tmp_path)])
    assert f"cannot write prepared data under {tmp_path / 'prepared'}" in line and "writable --data-dir" in line


def test_read_only_data_dir(capsys):
    # As root too: root ignores directory modes, so the harness runs as nobody here (see the helper).
    with searchable_tmp_dir() as base:
        data_dir = base / "data"
        random_mnist(str(data_dir), 20, 5)
        data_dir.chmod(0o555)
        with as_unprivileged_user():
            line = one_line_error(capsys, ["data", "prepare", "mnist", "--data-dir", str(data_dir)])
        assert f"cannot write prepared data under {data_dir / 'prepared'} (Permission denied)" in line
        assert_nothing_prepared(data_dir)


def test_damaged_prepared_data_is_reported_not_trained_on(tmp_path, capsys):
    random_mnist(str(tmp_path), 20, 5)
    assert main(["data", "prepare", "mnist", "--data-dir", str(tmp_path)]) == 0
    images = tmp_path / "prepared" / "mnist" / "test_images.npy"
    images.write_bytes(images.read_bytes()[:300])
    line = one_line_error(capsys, ["train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--max-steps", "1"])
    assert f"prepared data in {tmp_path / 'prepared' / 'mnist'} is damaged" in line
    assert "delete that directory and run `harness data prepare mnist" in line


def test_labels_out_of_range(tmp_path, capsys):
    write_mnist(
        str(tmp_path),
        (np.zeros((4, 28, 28), np.uint8), np.array([0, 1, 12, 3], np.uint8)),
        (np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.uint8)),
    )
    line = one_line_error(capsys, ["data", "prepare", "mnist", "--data-dir", str(tmp_path)])
    assert "mnist: train labels fall outside 0-9" in line
    assert_nothing_prepared(tmp_path)


def test_bad_model_files_for_evaluate(tmp_path, capsys):
    line = one_line_error(capsys, ["evaluate", "--model-file", str(tmp_path / "none.pt")])
    assert "does not exist; write one with `harness train --save-model" in line
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    line = one_line_error(capsys, ["evaluate", "--model-file", str(tmp_path / "junk.pt")])
    assert "is not a saved state_dict" in line
    model_file = tmp_path / "cnn.pt"
    assert main(["train", "--max-steps", "2", "--threads", "1", "--save-model", str(model_file)]) == 0
    capsys.readouterr()
    line = one_line_error(capsys, ["evaluate", "--model-file", str(model_file), "--model", "resnet18"])
    assert "does not fit the model of task 'images'" in line and "pass the --task and task arguments" in line


@pytest.mark.parametrize(
    "name, message",
    [("digits", "digits and synthetic need no download"), ("imagefolder", "imagefolder has no download")],
)
def test_datasets_without_a_download(tmp_path, capsys, name, message):
    assert message in one_line_error(capsys, ["data", "download", name, "--data-dir", str(tmp_path)])
