"""Checkpoints that lose nothing: atomic, verified, and resumable to the bit, for every backend.

Layout of `--checkpoint-dir D`::

    D/step-00000120/          one complete checkpoint, named by the global steps done before it
        manifest.json         written last: run facts, sampler position, progress, config, and the
                              size and sha256 of every other file
        model.pt              model + optimizer state (none, ddp, horovod: rank 0 writes it), or
        mp_rank_00_model_states.pt, zero_pp_rank_*_optim_states.pt, ...   DeepSpeed's own files
                              (every rank writes its ZeRO partition; engine.save_checkpoint), or
        dcp/.metadata, dcp/__0_0.distcp ...   fsdp: torch.distributed.checkpoint's files (every
                              rank writes its shards of weights and optimizer state)
        rank-00000.pt ...     one per rank: torch (and CUDA), numpy and python RNG states and the
                              rank's per-step losses of the unfinished epoch
    D/.partial-step-...       a checkpoint being written: never read, removed by the next save

What a checkpoint holds: model and optimizer state; the global step, which fixes the LR (a pure
function of the step, harness.training.lr) and the sampler position (epoch = step // steps_per_epoch, step
within the epoch = step % steps_per_epoch: the data order is a pure function of seed and epoch,
harness.data.sharding); every rank's RNG states; the run config; the progress the results record
needs (train loss per finished epoch, the last evaluation, how many segments the run took).

Atomic: every rank writes into D/.partial-step-N and fsyncs; after a barrier rank 0 hashes the
files, writes manifest.json, renames the directory to D/step-N (one atomic rename) and fsyncs D.
So a reader, and a job killed at any instant, sees a whole checkpoint or none. The newest
`--keep-checkpoints` are kept. A save also removes checkpoints of later steps than its own: they
belong to an abandoned future of the run (it was resumed from an earlier checkpoint) or are damaged.

Valid: manifest.json parses and every file it lists has the recorded size and sha256.
`--resume auto` takes the newest valid checkpoint and warns about each newer damaged one it skips
(a damaged checkpoint is never loaded). Every rank chooses independently, reading the same files,
so all choose the same one before any process group exists.

Loading: torch.load(weights_only=True) for every file, DeepSpeed's included (its engine is given a
loader that allows three of DeepSpeed's plain data classes and nothing else). A checkpoint of
another task (or the same task with other arguments), world size, global batch, optimizer or LR
setting is refused with a UsageError that names the difference and the fix; a task whose source
file changed since is resumed with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from ..config import TrainConfig
from ..errors import UsageError
from ..fileio import fsync_directory, load_tensors

if TYPE_CHECKING:
    from ..backends import Backend
    from ..process.discovery import ClusterEnv

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
NAME_PATTERN = re.compile(r"^step-(\d+)$")
PARTIAL_PREFIX = ".partial-"
RESUME_AUTO = "auto"
HASH_CHUNK = 1 << 20

# Config fields the saved state depends on. A different value would continue another experiment
# (other weights, data order, optimizer state layout or LR curve), so resuming refuses it; so do
# a backend's options declared resume_must_match (harness.backends.options). --epochs and
# --max-steps may grow: they only extend the run.
MUST_MATCH = (
    "seed",
    "optimizer",
    "lr",
    "lr_scaling",
    "base_batch",
    "momentum",
    "weight_decay",
    "warmup_epochs",
    "schedule",
    "grad_clip",
    "precision",
    "grad_accum",
)


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint taken after `step` optimizer steps."""
    return f"step-{step:08d}"


class DamagedCheckpoint(Exception):
    """A checkpoint directory that fails verification; the message says what is wrong."""


@dataclass(frozen=True)
class RunLayout:
    """Facts of a run that a checkpoint's sampler position and optimizer state depend on."""

    world_size: int
    global_batch: int
    train_set_size: int
    steps_per_epoch: int
    total_steps: int
    task: dict[str, Any] = field(default_factory=dict)  # spec, arguments and source sha256 of what trains


@dataclass
class Progress:
    """What the results record needs from earlier segments of a run, kept in the manifest."""

    train_losses: list[float] = field(default_factory=list)  # one per finished epoch
    evaluation: dict[str, Any] = field(default_factory=dict)  # the latest evaluation
    segments: int = 1  # processes that have worked on the run: 1 + resumes
    # Loss history in blocks of --log-every steps: block ends, mean losses, LRs, and the running
    # (loss x samples, samples) of the block not yet complete.
    history: dict[str, Any] = field(default_factory=lambda: {"step": [], "loss": [], "lr": [], "pending": [0.0, 0.0]})


@dataclass
class Checkpoint:
    """A verified checkpoint directory and its manifest."""

    path: str
    manifest: dict[str, Any]

    @property
    def step(self) -> int:
        return int(self.manifest["step"])


@dataclass
class ResumeState:
    """Where a resumed run continues: its global step, progress and this rank's losses of the epoch."""

    step: int
    progress: Progress
    epoch_step_losses: torch.Tensor  # [steps per epoch, 2]: (loss x samples, samples) per step, this rank


# -- checks that run before any process group starts -------------------------------------------


def list_checkpoints(directory: Optional[str]) -> list[tuple[int, str]]:
    """(step, name) of the complete-looking checkpoint directories in `directory`, oldest first."""
    if not directory or not os.path.isdir(directory):
        return []
    found = []
    for name in os.listdir(directory):
        match = NAME_PATTERN.match(name)
        if match and os.path.isdir(os.path.join(directory, name)):
            found.append((int(match.group(1)), name))
    return sorted(found)


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def capture_rng_state() -> dict[str, Any]:
    """torch (and CUDA), numpy and python RNG states of this process."""
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {
            "version": version,
            "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next,
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state."""
    torch.set_rng_state(state["torch"])
    saved = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            saved["keys"].numpy().astype(np.uint32),
            saved["position"],
            saved["has_gauss"],
            saved["cached_gaussian"],
        )
    )
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"].tolist()), python["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def rank_file(rank: int) -> str:
    """Name of rank `rank`'s own state file inside a checkpoint."""
    return f"rank-{rank:05d}.pt"


# -- writing and restoring -------------------------------------------------------------------


class Checkpointer:
    """Writes the checkpoints of one run into --checkpoint-dir; every rank makes the same calls."""

    def __init__(self, config: TrainConfig, cluster: ClusterEnv, backend: Backend, layout: RunLayout) -> None:
        assert config.checkpoint_dir, "Checkpointer needs --checkpoint-dir"
        self.directory = os.path.abspath(config.checkpoint_dir)
        self.config, self.cluster, self.backend, self.layout = config, cluster, backend, layout
        self.seconds = 0.0  # time spent writing checkpoints, kept out of the throughput windows
        self.last_path: Optional[str] = None

    def due(self, step: int) -> bool:
        """True after the steps where --checkpoint-every asks for a checkpoint."""
        return bool(self.config.checkpoint_every) and step % self.config.checkpoint_every == 0

    def save(self, step: int, progress: Progress, epoch_step_losses: torch.Tensor, reason: str) -> float:
        """Write the checkpoint after `step` steps (a collective); return the seconds it took."""
        started = time.perf_counter()
        name = checkpoint_name(step)
        partial = os.path.join(self.directory, PARTIAL_PREFIX + name)
        if self.cluster.is_main:
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
        self.backend.barrier()  # the directory exists before any rank writes into it
        self.backend.save_checkpoint(partial, self.cluster.rank)
        torch.save(
            {"rng": capture_rng_state(), "epoch_step_losses": epoch_step_losses.detach().cpu()},
            os.path.join(partial, rank_file(self.cluster.rank)),
        )
        _fsync_tree(partial)
        self.backend.barrier()  # every rank's files are on disk before the manifest vouches for them
        final = os.path.join(self.directory, name)
        if self.cluster.is_main:
            manifest = self._manifest(step, progress, partial, reason)
            _write_json(os.path.join(partial, MANIFEST), manifest)  # the rename below makes it all atomic
            self._remove_from(step)  # a stale or damaged checkpoint from a later step than this one
            os.replace(partial, final)
            fsync_directory(self.directory)
            self._prune()
        self.backend.barrier()  # the checkpoint is complete before any rank moves on or exits
        self.last_path = final
        elapsed = time.perf_counter() - started
        self.seconds += elapsed
        return elapsed

    def _manifest(self, step: int, progress: Progress, partial: str, reason: str) -> dict[str, Any]:
        from ..version import __version__

        files = {}
        for root, _, names in os.walk(partial):
            for file_name in names:
                file_path = os.path.join(root, file_name)
                relative = os.path.relpath(file_path, partial)
                files[relative] = {"bytes": os.path.getsize(file_path), "sha256": file_sha256(file_path)}
        epoch, step_in_epoch = divmod(step, self.layout.steps_per_epoch)
        return {
            "format_version": FORMAT_VERSION,
            "harness_version": __version__,
            "written": time.time(),
            "reason": reason,
            "checkpoint_format": self.backend.checkpoint_format,
            "step": step,
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "run": vars(self.layout).copy(),
            "progress": vars(progress).copy(),
            "config": self.config.to_dict(),
            "files": files,
        }

    def _remove_from(self, step: int) -> None:
        for other_step, other in list_checkpoints(self.directory):
            if other_step >= step:
                shutil.rmtree(os.path.join(self.directory, other))

    def _prune(self) -> None:
        for _, name in list_checkpoints(self.directory)[: -self.config.keep_checkpoints]:
            shutil.rmtree(os.path.join(self.directory, name))
        for name in os.listdir(self.directory):  # left by a job killed while writing
            if name.startswith(PARTIAL_PREFIX):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)


def restore(checkpoint: Checkpoint, backend: Backend, cluster: ClusterEnv, device: torch.device) -> ResumeState:
    """Load `checkpoint` into the wrapped model and optimizer and this rank's RNGs (every rank calls it)."""
    backend.load_checkpoint(checkpoint.path, device)
    rank_state = load_tensors(os.path.join(checkpoint.path, rank_file(cluster.rank)))
    try:
        restore_rng_state(rank_state["rng"])
        step_losses = rank_state["epoch_step_losses"].to(device)
        progress = Progress(**checkpoint.manifest["progress"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(
            f"checkpoint {checkpoint.path} lacks part of the training state ({exc!r}); resume from "
            "another checkpoint, or start a new run with another --checkpoint-dir"
        ) from None
    progress.segments += 1
    return ResumeState(checkpoint.step, progress, step_losses)


def _write_json(path: str, value: dict[str, Any]) -> None:
    with open(path, "w") as handle:
        json.dump(value, handle, indent=1, sort_keys=True)  # a diverged run's NaN loss must not stop the save
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_tree(directory: str) -> None:
    # Every rank fsyncs what it can see; on one node one fsync per file would do, but on a shared
    # filesystem each client must flush what it wrote itself.
    for root, _, names in os.walk(directory):
        for file_name in names:
            fd = os.open(os.path.join(root, file_name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
