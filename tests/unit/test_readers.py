"""Readers, preparation and augmentation, on small files the tests write in each format.

The writers (IDX, CIFAR pickles, an image tree) are in tests/helpers/data_files.py.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from harness.data import DataOptions, load_split, prepare_dataset
from harness.data.readers import decode_image, read_cifar10_split, read_idx, read_idx_split, scan_image_tree
from harness.data.transforms import RandomCropFlip
from harness.errors import UsageError
from tests.helpers.data_files import random_mnist, write_cifar10, write_idx, write_image_tree, write_mnist


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gzipped"])
def test_idx_split_round_trips(tmp_path, gz):
    arrays = random_mnist(str(tmp_path), 13, 7, gz=gz)
    images, labels = read_idx_split("mnist", str(tmp_path / "MNIST" / "raw"), "train", str(tmp_path))
    assert images.shape == (13, 1, 28, 28) and images.dtype == np.uint8 and labels.dtype == np.int64
    assert np.array_equal(images[:, 0], arrays["train_images"]) and np.array_equal(labels, arrays["train_labels"])
    images, _ = read_idx_split("mnist", str(tmp_path / "MNIST" / "raw"), "test", str(tmp_path))
    assert np.array_equal(images[:, 0], arrays["test_images"])


def test_truncated_and_foreign_idx_files_are_rejected(tmp_path):
    path = str(tmp_path / "x-idx3-ubyte")
    write_idx(path, np.zeros((4, 28, 28), dtype=np.uint8))
    with open(path, "r+b") as handle:
        handle.truncate(100)
    with pytest.raises(UsageError, match=r"truncated \(100 bytes, expected 3152"):
        read_idx(path, "mnist", str(tmp_path))
    with open(path, "wb") as handle:
        handle.write(b"<html>not found</html>")
    with pytest.raises(UsageError, match="not an IDX file.*harness data download mnist"):
        read_idx(path, "mnist", str(tmp_path))
    with open(path, "wb") as handle:
        handle.write(b"\x1f\x8b\x08garbage")
    os.rename(path, path + ".gz")
    with pytest.raises(UsageError, match="unreadable"):
        read_idx(path + ".gz", "mnist", str(tmp_path))


def test_labels_that_do_not_match_images_are_rejected(tmp_path):
    raw = write_mnist(
        str(tmp_path),
        (np.zeros((5, 28, 28), np.uint8), np.zeros(4, np.uint8)),
        (np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.uint8)),
    )
    with pytest.raises(UsageError, match="4 labels for 5 images"):
        read_idx_split("mnist", raw, "train", str(tmp_path))


# -- CIFAR-10 -------------------------------------------------------------------------------------


def test_cifar10_batches_are_read_in_order(tmp_path):
    arrays = write_cifar10(str(tmp_path), per_batch=3)
    for split in ("train", "test"):
        images, labels = read_cifar10_split(str(tmp_path), split)
        assert images.shape == (15 if split == "train" else 3, 3, 32, 32)
        assert np.array_equal(images, arrays[f"{split}_images"]) and np.array_equal(labels, arrays[f"{split}_labels"])


def test_corrupt_and_malicious_cifar_pickles_are_rejected(tmp_path):
    write_cifar10(str(tmp_path), per_batch=2)
    batch = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:200])
    with pytest.raises(UsageError, match="data_batch_3 is not a CIFAR python batch"):
        read_cifar10_split(str(tmp_path), "train")

    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    batch.write_bytes(pickle.dumps({"data": Exploit(), "labels": [0]}))
    with pytest.raises(UsageError, match="refusing to load"):
        read_cifar10_split(str(tmp_path), "train")
    batch.write_bytes(pickle.dumps({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}))
    with pytest.raises(UsageError, match=r"shape \(2, 100\)"):
        read_cifar10_split(str(tmp_path), "train")


# -- image tree -----------------------------------------------------------------------------------


def test_image_tree_scan_and_decode(tmp_path):
    write_image_tree(str(tmp_path / "train"), ["cat", "ant"], per_class=2, size=(40, 20), suffix=".jpg")
    paths, labels, classes = scan_image_tree(str(tmp_path / "train"))
    assert classes == ["ant", "cat"] and labels.tolist() == [0, 0, 1, 1]
    assert [os.path.basename(os.path.dirname(p)) for p in paths] == ["ant", "ant", "cat", "cat"]
    image = decode_image(paths[0], 16)  # 40x20 -> 32x16 (shorter side 16) -> centre 16x16
    assert image.shape == (3, 16, 16) and image.dtype == np.uint8
    assert abs(int(image[0].mean()) - 40) <= 3 and abs(int(image[2].mean()) - 200) <= 3  # ant: red 40, blue 200


def test_image_tree_errors(tmp_path):
    (tmp_path / "train" / "ant").mkdir(parents=True)
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")
    with pytest.raises(UsageError, match="no images under .*/train; expected .*/train/<class>/<image>"):
        scan_image_tree(str(tmp_path / "train"))
    write_image_tree(str(tmp_path / "val"), ["bee"], per_class=1)
    with pytest.raises(UsageError, match=r"classes \['bee'\] that the training split lacks"):
        scan_image_tree(str(tmp_path / "val"), ["ant"])
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(UsageError, match="cannot decode .*broken.png"):
        decode_image(str(broken), 8)


# -- prepare and load -------------------------------------------------------------------------------


def options(data_dir, image_size: int = 64) -> DataOptions:
    return DataOptions(str(data_dir), "cnn", image_size, prepare_timeout=60.0)


def test_prepared_mnist_is_memory_mapped_with_training_statistics(tmp_path):
    arrays = random_mnist(str(tmp_path), 50, 11)
    directory, prepared_now = prepare_dataset("mnist", str(tmp_path), 64, 60.0)
    assert prepared_now and directory == str(tmp_path / "prepared" / "mnist")
    assert sorted(os.listdir(tmp_path / "prepared")) == ["mnist"]  # no lock or scratch left behind
    assert prepare_dataset("mnist", str(tmp_path), 64, 60.0) == (directory, False)
    train = load_split("mnist", "train", options(tmp_path))
    test = load_split("mnist", "test", options(tmp_path))
    assert isinstance(train.images, np.memmap) and train.shape == (1, 28, 28) and (len(train), len(test)) == (50, 11)
    assert np.array_equal(train.images[:, 0], arrays["train_images"])
    assert np.array_equal(test.labels, arrays["test_labels"].astype(np.int64))
    pixels = arrays["train_images"] / 255.0
    assert train.mean[0] == pytest.approx(pixels.mean()) and train.std[0] == pytest.approx(pixels.std())
    assert test.mean == train.mean  # the test set is normalised with the training statistics
    images, labels = train.fetch(np.array([7, 3, 41]))  # a batch keeps each image with its label
    assert {(img.numpy().tobytes(), int(label)) for img, label in zip(images[:, 0], labels)} == {
        (arrays["train_images"][i].tobytes(), int(arrays["train_labels"][i])) for i in (7, 3, 41)
    }


def test_prepared_arrays_travel_to_loader_workers_by_file_name(tmp_path):
    random_mnist(str(tmp_path), 300, 5)
    train = load_split("mnist", "train", options(tmp_path))
    payload = pickle.dumps(train)  # what a spawn or forkserver worker receives
    assert len(payload) < train.labels.nbytes + 2_000 < train.images.nbytes  # labels only, not the images
    copy = pickle.loads(payload)
    assert isinstance(copy.images, np.memmap) and np.array_equal(copy.images, train.images)
    assert copy.mean == train.mean and np.array_equal(copy.labels, train.labels)


def test_fashion_mnist_cifar10_and_imagefolder_prepare(tmp_path):
    random_mnist(str(tmp_path), 6, 4, folder="FashionMNIST")
    assert len(load_split("fashion-mnist", "test", options(tmp_path))) == 4
    cifar = write_cifar10(str(tmp_path), per_batch=2)
    loaded = load_split("cifar10", "train", options(tmp_path))
    assert loaded.shape == (3, 32, 32) and np.array_equal(loaded.images, cifar["train_images"])
    write_image_tree(str(tmp_path / "train"), ["a", "b", "c"], per_class=2)
    write_image_tree(str(tmp_path / "val"), ["a", "c"], per_class=1)
    train = load_split("imagefolder", "train", options(tmp_path, image_size=12))
    test = load_split("imagefolder", "test", options(tmp_path, image_size=12))
    assert train.shape == (3, 12, 12) and train.num_classes == 3 and test.labels.tolist() == [0, 2]
    assert os.path.isdir(tmp_path / "prepared" / "imagefolder-12px")


# -- augmentation -----------------------------------------------------------------------------------


def reference_crop_flip(image: np.ndarray, top: int, left: int, flip: int, padding: int = 4) -> np.ndarray:
    """torchvision's recipe for one image: zero-pad, crop at (top, left), then maybe mirror."""
    padded = np.pad(image, ((0, 0), (padding, padding), (padding, padding)))
    crop = padded[:, top : top + image.shape[1], left : left + image.shape[2]]
    return crop[:, :, ::-1] if flip else crop


def test_random_crop_flip_matches_the_per_image_recipe():
    images = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (6, 3, 8, 10), dtype=np.uint8))
    augment = RandomCropFlip(seed=5, rank=0, world_size=1, local_batch=6)
    out = augment(images, epoch=2, step=17)
    draws = augment.draws(2, 17)
    assert draws[:, 2].min() == 0 and draws[:, 2].max() == 1  # both flipped and unflipped images occur
    for i, (top, left, flip) in enumerate(draws):
        assert np.array_equal(out[i].numpy(), reference_crop_flip(images[i].numpy(), top, left, flip))
    assert torch.equal(out, augment(images, epoch=2, step=17))  # replayable from (seed, epoch, step)
    assert not torch.equal(out, augment(images, epoch=2, step=18))


def test_augmentation_of_a_sample_does_not_depend_on_the_world_size():
    single = RandomCropFlip(seed=1, rank=0, world_size=1, local_batch=12).draws(0, 4)
    split = [RandomCropFlip(seed=1, rank=r, world_size=3, local_batch=4).draws(0, 4) for r in range(3)]
    assert np.array_equal(np.concatenate(split), single)


def test_a_preparer_holding_the_lock_makes_others_wait_then_they_reuse_its_result(tmp_path):
    import fcntl
    import threading

    random_mnist(str(tmp_path), 20, 5)
    (tmp_path / "prepared").mkdir()
    lock = os.open(tmp_path / "prepared" / ".mnist.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another process is preparing mnist
    with pytest.raises(UsageError, match=r"waited 0 s for another process preparing mnist .*raise --timeout"):
        prepare_dataset("mnist", str(tmp_path), 64, timeout=0.3)
    # Finish "the other process's" work while a second caller waits, then let go of the lock.
    threading.Timer(0.5, lambda: (prepare_for_holder(tmp_path), os.close(lock))).start()
    assert prepare_dataset("mnist", str(tmp_path), 64, timeout=30) == (str(tmp_path / "prepared" / "mnist"), False)
    assert os.listdir(tmp_path / "prepared") == ["mnist"]


def prepare_for_holder(data_dir) -> None:
    """What the lock holder does: write the finished directory atomically."""
    from harness.data.disk import DISK_DATASETS
    from harness.data.prepare import _write_atomically

    _write_atomically(DISK_DATASETS["mnist"], str(data_dir), 64, str(data_dir / "prepared" / "mnist"))
