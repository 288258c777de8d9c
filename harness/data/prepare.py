"""Prepare once, memory-map at train time: raw files -> uint8 `.npy` arrays under DATA/prepared/.

Layout of a prepared dataset, DATA/prepared/<name>/ (imagefolder: <name>-<size>px/):
`{train,test}_images.npy` (uint8 [N, C, H, W]), `{train,test}_labels.npy` (int64 [N]) and
`meta.json` (classes, per-channel mean and std of the training images, sizes, format version).

Who prepares. A job's ranks call `ensure_prepared` before any process group exists, so there is no
collective barrier to wait at yet. Instead the ranks that share a filesystem elect one preparer with
an exclusive `flock` on DATA/prepared/.<name>.lock; the others block on the same lock (polling,
bounded by --timeout) and, once they hold it, find the finished directory and return at once. This
gives exactly one preparer per filesystem without knowing the cluster layout: a shared filesystem
gets one for the whole job, node-local scratch gets one per node (local_rank 0 would be wrong on a
shared filesystem, where every node's local rank 0 would prepare at once). The lock is released by
the kernel if its holder dies, so a crashed job leaves no stale lock behind.

Nothing half-written is ever seen: the preparer writes into a temporary directory beside the target
and renames it into place only when complete, so the target either does not exist or is whole.
That rename is also what keeps a filesystem without working `flock` correct (some Lustre mounts):
two preparers may then both work, and the second rename finds the target present and is discarded.
On any error the temporary directory is removed and the lock passes to the next waiter, which tries
again; bad input thus fails on every rank with the same one-line error. `prepare_once` is that
protocol for any directory of prepared data (the transformer task's token corpus, harness.data.tokens).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Callable

import numpy as np

from ..errors import UsageError
from .arrays import ImageArrays
from .disk import DiskDataset, SplitSource

PREPARED_FORMAT = 1
SPLITS = ("train", "test")
LOCK_POLL_S = 0.2


def prepared_root(data_dir: str) -> str:
    """Where prepared datasets live inside --data-dir."""
    return os.path.join(data_dir, "prepared")


def prepare_hint(spec: DiskDataset, data_dir: str, image_size: int) -> str:
    """The command that prepares `spec` by hand."""
    size = f" --image-size {image_size}" if spec.resized else ""
    return f"`harness data prepare {spec.name} --data-dir {data_dir}{size}`"


def ensure_prepared(spec: DiskDataset, data_dir: str, image_size: int, timeout: float) -> tuple[str, bool]:
    """(directory of the prepared arrays, whether this call prepared them); prepares at most once.

    Safe to call from every rank at once (see the module docstring); waits at most `timeout`
    seconds for another process that is preparing the same dataset.
    """
    target = os.path.join(prepared_root(data_dir), spec.prepared_name(image_size))
    wrote = prepare_once(
        target,
        f"{spec.name} from {data_dir}",
        lambda scratch: _write_dataset(spec, data_dir, image_size, scratch),
        timeout,
        hint=prepare_hint(spec, data_dir, image_size),
        advice=_writable_advice(spec, image_size),
        is_complete=lambda directory: _is_complete(directory, spec, data_dir, image_size),
    )
    return target, wrote


def prepare_once(
    target: str,
    what: str,
    write: Callable[[str], None],
    timeout: float,
    *,
    hint: str,
    advice: str,
    is_complete: Callable[[str], bool] = os.path.isdir,
) -> bool:
    """Make directory `target` by `write(scratch directory)` at most once per filesystem, with the
    lock and the atomic rename of the module docstring; True when this call wrote it. `what` names
    the data in the progress line; `hint` is the command that prepares it by hand and `advice` what
    to do where `target` cannot be written, for the error lines."""
    if is_complete(target):
        return False
    root = os.path.dirname(target)
    try:
        os.makedirs(root, exist_ok=True)
    except OSError as exc:
        raise _unwritable(root, exc, advice) from exc
    lock = os.path.join(root, f".{os.path.basename(target)}.lock")
    with _exclusive(lock, timeout, what, hint, advice):
        if is_complete(target):  # another process finished while we waited
            return False
        print(f"harness: preparing {what} into {target} (once; other processes wait)", flush=True)
        _rename_when_written(target, write, advice)
    return True


def open_prepared(directory: str, split: str, spec: DiskDataset, data_dir: str, image_size: int) -> ImageArrays:
    """The prepared `split`, images memory-mapped (pages are shared by all ranks and workers on a node)."""
    try:
        meta = _read_meta(directory)
        images = np.load(os.path.join(directory, f"{split}_images.npy"), mmap_mode="r")
        labels = np.load(os.path.join(directory, f"{split}_labels.npy"))
        count = meta["splits"][split]
        if images.dtype != np.uint8 or images.shape != (count, *meta["shape"]) or labels.shape != (count,):
            raise ValueError(
                f"{split} arrays have shapes {images.shape} and {labels.shape}, "
                f"meta.json says {count} x {meta['shape']}"
            )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"prepared data in {directory} is damaged ({exc}); delete that directory and run "
            f"{prepare_hint(spec, data_dir, image_size)}"
        ) from exc
    return ImageArrays(
        images, labels.astype(np.int64, copy=False), meta["num_classes"], tuple(meta["mean"]), tuple(meta["std"])
    )


def _read_meta(directory: str) -> dict:
    with open(os.path.join(directory, "meta.json")) as handle:
        return json.load(handle)


def _is_complete(target: str, spec: DiskDataset, data_dir: str, image_size: int) -> bool:
    # The directory appears only by an atomic rename of a finished one, so existing means complete.
    if not os.path.isdir(target):
        return False
    try:
        version = _read_meta(target).get("format")
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"prepared data in {target} is damaged ({exc}); delete that directory and run "
            f"{prepare_hint(spec, data_dir, image_size)}"
        ) from exc
    if version != PREPARED_FORMAT:
        raise UsageError(
            f"{target} was prepared in format {version}, this harness reads format {PREPARED_FORMAT}; "
            f"delete that directory and run {prepare_hint(spec, data_dir, image_size)}"
        )
    return True


def _writable_advice(spec: DiskDataset, image_size: int) -> str:
    return (
        f"use a writable --data-dir (copy the raw files) or run "
        f"{prepare_hint(spec, '<writable dir>', image_size)} elsewhere"
    )


def _unwritable(path: str, exc: OSError, advice: str) -> UsageError:
    return UsageError(f"cannot write prepared data under {path} ({exc.strerror or exc}); {advice}")


@contextlib.contextmanager
def _exclusive(lock_path: str, timeout: float, what: str, hint: str, advice: str) -> Iterator[None]:
    """Hold an exclusive flock on `lock_path`, waiting at most `timeout` seconds for it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise _unwritable(os.path.dirname(lock_path), exc, advice) from exc
        try:
            if not _lock(fd, deadline):
                raise UsageError(
                    f"waited {timeout:.0f} s for another process preparing {what} (it holds "
                    f"{lock_path}); raise --timeout or run {hint} before the job"
                )
            # The previous holder unlinks the path when done: a lock on that old inode excludes no one.
            if _same_file(fd, lock_path):
                try:
                    yield
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(lock_path)
                return
        finally:
            os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _lock(fd: int, deadline: float) -> bool:
    """Take the flock, polling until `deadline`; True when held (or when the filesystem has no flock)."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(LOCK_POLL_S)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                return True  # no flock here: the atomic rename alone keeps the result whole
            raise


def _write_atomically(spec: DiskDataset, data_dir: str, image_size: int, target: str) -> None:
    """Prepare `spec` into `target` without the lock (what the lock's holder does)."""
    _rename_when_written(
        target,
        lambda scratch: _write_dataset(spec, data_dir, image_size, scratch),
        _writable_advice(spec, image_size),
    )


def _rename_when_written(target: str, write: Callable[[str], None], advice: str) -> None:
    """`write` into a scratch directory beside `target`, then rename it to `target` (nothing half-written)."""
    root = os.path.dirname(target)
    try:
        scratch = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=root)
    except OSError as exc:
        raise _unwritable(root, exc, advice) from exc
    try:
        try:
            write(scratch)
            os.chmod(scratch, 0o777 & ~_umask())  # mkdtemp's 0700 would hide the data from the job's other users
            for name in os.listdir(scratch):  # on disk before the rename makes them visible
                with open(os.path.join(scratch, name), "rb") as handle:
                    os.fsync(handle.fileno())
            os.rename(scratch, target)
        except OSError as exc:
            if os.path.isdir(target):  # a preparer on a filesystem without flock finished first
                return
            raise _unwritable(root, exc, advice) from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _write_dataset(spec: DiskDataset, data_dir: str, image_size: int, scratch: str) -> None:
    """The prepared arrays and meta.json of `spec` into directory `scratch`."""
    splits, classes = spec.read(data_dir, image_size)
    meta = _write_splits(spec.name, splits, classes, scratch)
    meta.update(
        format=PREPARED_FORMAT,
        dataset=spec.name,
        source=os.path.abspath(data_dir),
        image_size=image_size if spec.resized else None,
    )
    with open(os.path.join(scratch, "meta.json"), "w") as handle:
        json.dump(meta, handle, indent=1)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_splits(name: str, splits: dict[str, SplitSource], classes: list[str], directory: str) -> dict:
    sizes: dict[str, int] = {}
    mean: list[float] = []
    std: list[float] = []
    for split in SPLITS:
        source = splits[split]
        if split != "train" and source.shape != splits["train"].shape:
            raise UsageError(
                f"{name}: {split} images are {source.shape}, training images {splits['train'].shape}; "
                "the files are corrupt or from different datasets, fetch them again"
            )
        if source.labels.size and (source.labels.min() < 0 or source.labels.max() >= len(classes)):
            raise UsageError(
                f"{name}: {split} labels fall outside 0-{len(classes) - 1}; the files are corrupt, fetch them again"
            )
        images = np.lib.format.open_memmap(
            os.path.join(directory, f"{split}_images.npy"),
            mode="w+",
            dtype=np.uint8,
            shape=(source.count, *source.shape),
        )
        channels = source.shape[0]
        sums = np.zeros((2, channels), dtype=np.float64)  # per-channel sum and sum of squares
        written = 0
        for chunk in source.chunks:
            images[written : written + len(chunk)] = chunk
            written += len(chunk)
            flat = chunk.reshape(len(chunk), channels, -1).astype(np.float64)
            sums += (flat.sum(axis=(0, 2)), np.square(flat).sum(axis=(0, 2)))
        images.flush()
        del images
        np.save(os.path.join(directory, f"{split}_labels.npy"), source.labels.astype(np.int64))
        sizes[split] = source.count
        if split == "train":  # normalisation statistics come from the training images only
            pixels = max(1, source.count * int(np.prod(source.shape[1:])))
            mean = (sums[0] / pixels / 255).tolist()
            std = np.sqrt(np.maximum(sums[1] / pixels / 255**2 - np.square(sums[0] / pixels / 255), 1e-12)).tolist()
            shape = list(source.shape)
    return {"num_classes": len(classes), "classes": classes, "shape": shape, "splits": sizes, "mean": mean, "std": std}
