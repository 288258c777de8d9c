"""Token data for the built-in `transformer` task: windows of a token stream, by index.

- `corpus`: the Python standard library's own source (every `.py` file under `sysconfig`'s stdlib
  directory, test suites, site-packages and the build's `_sysconfigdata` left out), in sorted path
  order, each file's bytes followed by a NUL byte (which no source file holds) as an end of
  document. It ships with every Python, needs no download, and is real, varied text (code,
  docstrings, comments: about 12 MB for CPython 3.11). Tokens are its bytes, a vocabulary of 256:
  honest, with no tokenizer to fetch or train. A file goes to the test split when the CRC-32 of its
  relative path is divisible by 20 (about 5%), so the split is the same wherever the same files are
  installed and whole documents stay on one side. It is written once per filesystem into
  DATA/prepared/<name>/ as uint8 `.npy` arrays (harness.data.prepare.prepare_once: one preparer,
  the others wait, nothing half-written) and memory-mapped at train time. The directory's name
  holds the Python version and a fingerprint of the files' paths and sizes, so another Python's
  standard library is prepared beside it, never read in its place (the next run prepares it again
  when the directory is deleted).
- `synthetic`: token sequences of a seeded Markov chain (each token has BRANCHES possible
  successors, fixed by SYNTHETIC_SEED), window i drawn from its own generator seeded by (split, i):
  deterministic, no file, any vocabulary, and learnable (a model can bring the loss from
  log(vocab) down towards log(BRANCHES)).

Window i of a stream holds tokens [i * T, (i + 1) * T + 1): its inputs are the first T, its targets
the last T (the next token at every position). Windows do not overlap (a token is an input once per
epoch) and may cross a document boundary, as GPT-style training on concatenated documents does.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
import zlib
from typing import Any, Optional

import numpy as np
import torch

from ..errors import UsageError
from .prepare import prepare_once, prepared_root

BYTE_VOCABULARY = 256
END_OF_DOCUMENT = 0  # the NUL byte after every file of the corpus
TEST_EVERY = 20  # a file whose path's CRC-32 is divisible by this is a test document
SKIPPED_DIRECTORIES = frozenset({"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"})
CORPUS_FORMAT = 1
SPLITS = ("train", "test")

BRANCHES = 4  # successors of each token in the synthetic chain
SYNTHETIC_SEED = 0
SYNTHETIC_WINDOWS = {"train": 60_000, "test": 2_000}


def corpus_files(root: Optional[str] = None) -> list[str]:
    """The corpus's files: paths relative to the standard library directory `root`, sorted."""
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for folder, directories, files in os.walk(root):
        directories[:] = [name for name in directories if name not in SKIPPED_DIRECTORIES]
        relative = os.path.relpath(folder, root)
        if relative != "." and relative.split(os.sep)[0].startswith("config-"):
            continue  # the build's own configuration, not the library
        found += [
            os.path.normpath(os.path.join(relative, name))
            for name in files
            if name.endswith(".py") and not name.startswith("_sysconfigdata")
        ]
    return sorted(found)


def is_test_document(relative_path: str) -> bool:
    """Whether a corpus file belongs to the test split (fixed by its path alone)."""
    return zlib.crc32(relative_path.replace(os.sep, "/").encode()) % TEST_EVERY == 0


def corpus_name(root: Optional[str] = None) -> str:
    """The prepared directory's name: the Python version and a fingerprint of the files' paths and
    sizes (and of CORPUS_FORMAT)."""
    root = root or sysconfig.get_paths()["stdlib"]
    listing = hashlib.sha256(f"format {CORPUS_FORMAT}\n".encode())  # a new format: a new directory
    for relative in corpus_files(root):
        listing.update(f"{relative}\0{os.path.getsize(os.path.join(root, relative))}\n".encode())
    return f"stdlib-bytes-py{sys.version_info.major}.{sys.version_info.minor}-{listing.hexdigest()[:12]}"


def _write_corpus(root: str, directory: str) -> None:
    """The corpus's splits as uint8 arrays and meta.json (sizes, sha256 of each split) into `directory`."""
    documents: dict[str, list[bytes]] = {split: [] for split in SPLITS}
    for relative in corpus_files(root):
        with open(os.path.join(root, relative), "rb") as handle:
            documents["test" if is_test_document(relative) else "train"].append(
                handle.read() + bytes([END_OF_DOCUMENT])
            )
    meta: dict[str, Any] = {"format": CORPUS_FORMAT, "source": root, "python": sys.version.split()[0], "splits": {}}
    for split, texts in documents.items():
        stream = np.frombuffer(b"".join(texts), dtype=np.uint8)
        np.save(os.path.join(directory, f"{split}_tokens.npy"), stream)
        meta["splits"][split] = {
            "documents": len(texts),
            "tokens": len(stream),
            "sha256": hashlib.sha256(stream.tobytes()).hexdigest(),
        }
    with open(os.path.join(directory, "meta.json"), "w") as handle:
        json.dump(meta, handle, indent=1)


def prepare_corpus(data_dir: str, timeout: float, root: Optional[str] = None) -> str:
    """The directory of the prepared corpus under `data_dir`, written first if it is not there
    (by one process per filesystem; the others wait at most `timeout` seconds)."""
    root = root or sysconfig.get_paths()["stdlib"]
    target = os.path.join(prepared_root(data_dir), corpus_name(root))
    prepare_once(
        target,
        f"the token corpus (the standard library in {root})",
        lambda scratch: _write_corpus(root, scratch),
        timeout,
        hint=f"the task once with --tokens-dir {data_dir} on one process",
        advice="use a writable --tokens-dir",
    )
    return target


class TokenWindows:
    """Windows of `sequence_length` + 1 tokens of a token file, by index: `fetch` gives (inputs,
    targets), int64 [batch, sequence_length] each. The file is memory-mapped, and reopened (not
    copied) in a data-loader worker."""

    def __init__(self, path: str, sequence_length: int) -> None:
        self.path, self.sequence_length = path, sequence_length
        self._tokens: Optional[np.ndarray] = None

    @property
    def tokens(self) -> np.ndarray:
        """The whole token stream, memory-mapped."""
        if self._tokens is None:
            self._tokens = np.load(self.path, mmap_mode="r")
        return self._tokens

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.sequence_length)

    def fetch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        starts = np.asarray(indices, dtype=np.int64)[:, None] * self.sequence_length
        windows = torch.from_numpy(self.tokens[starts + np.arange(self.sequence_length + 1)].astype(np.int64))
        return windows[:, :-1], windows[:, 1:]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}


def corpus_windows(data_dir: str, sequence_length: int, timeout: float) -> dict[str, TokenWindows]:
    """The corpus's train and test windows of `sequence_length`; a length that leaves a split
    without a window raises UsageError naming the longest that fits."""
    directory = prepare_corpus(data_dir, timeout)
    windows = {
        split: TokenWindows(os.path.join(directory, f"{split}_tokens.npy"), sequence_length) for split in SPLITS
    }
    try:
        shortest = min(len(split.tokens) for split in windows.values())
    except (OSError, ValueError) as exc:
        raise UsageError(f"the prepared corpus in {directory} is damaged ({exc}); delete that directory") from exc
    if shortest - 1 < sequence_length:
        raise UsageError(
            f"--sequence-length {sequence_length} is longer than the corpus's test split allows "
            f"({shortest:,} tokens); use --sequence-length {shortest - 1} or less"
        )
    return windows


class SyntheticTokens:
    """`count` windows of a seeded Markov chain over `vocab` tokens (see the module docstring);
    the same windows for the same (split, index) on every rank, in every run."""

    def __init__(self, split: str, count: int, sequence_length: int, vocab: int) -> None:
        self.split_key = SPLITS.index(split)
        self.count, self.sequence_length, self.vocab = count, sequence_length, vocab
        self.successors = np.random.default_rng(SYNTHETIC_SEED).integers(0, vocab, size=(vocab, BRANCHES))

    def __len__(self) -> int:
        return self.count

    def fetch(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        draws = [np.random.default_rng((SYNTHETIC_SEED, self.split_key, int(index))) for index in indices]
        starts = np.array([draw.integers(0, self.vocab) for draw in draws], dtype=np.int64)
        choices = np.array([draw.integers(0, BRANCHES, size=self.sequence_length) for draw in draws], dtype=np.int64)
        windows = np.empty((len(draws), self.sequence_length + 1), dtype=np.int64)
        windows[:, 0] = starts
        for position in range(self.sequence_length):
            windows[:, position + 1] = self.successors[windows[:, position], choices[:, position]]
        tokens = torch.from_numpy(windows)
        return tokens[:, :-1], tokens[:, 1:]


def synthetic_windows(
    sequence_length: int, vocab: int, test_windows: Optional[int] = None
) -> dict[str, SyntheticTokens]:
    """The synthetic train and test windows; `test_windows` held-out windows instead of the default's."""
    counts = {**SYNTHETIC_WINDOWS, **({"test": test_windows} if test_windows else {})}
    return {split: SyntheticTokens(split, counts[split], sequence_length, vocab) for split in SPLITS}
