"""Which checkpoint a run resumes from, and whether it may: the flags checked before any process
group exists, a checkpoint verified against its manifest (every file's size and sha256), `--resume
auto`'s choice of the newest valid one, and the refusal of a checkpoint of another run (see
harness.training.checkpoint for what a checkpoint holds and how it is written)."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Optional

from ..config import TrainConfig, flag_name
from ..errors import UsageError
from .checkpoint import (
    FORMAT_VERSION,
    MANIFEST,
    MUST_MATCH,
    RESUME_AUTO,
    Checkpoint,
    DamagedCheckpoint,
    RunLayout,
    file_sha256,
    list_checkpoints,
)

if TYPE_CHECKING:
    from ..backends import Backend


def check_checkpoint_flags(config: TrainConfig) -> None:
    """Raise UsageError for checkpoint flags that cannot work together or with the filesystem."""
    if config.checkpoint_every and not config.checkpoint_dir:
        raise UsageError("--checkpoint-every needs --checkpoint-dir DIR to write the checkpoints to")
    directory = config.checkpoint_dir
    if directory is not None:
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise UsageError(f"--checkpoint-dir {directory} is a file; give a directory")
        existing = _parent_that_exists(directory)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UsageError(
                f"--checkpoint-dir {directory} is not writable ({existing} denies it); "
                "choose a directory you can write to"
            )
    if config.resume is None:
        found = list_checkpoints(directory) if directory else []
        if found:
            raise UsageError(
                f"--checkpoint-dir {directory} already holds checkpoints (newest {found[-1][1]}); "
                "add --resume auto to continue that run, or choose an empty directory"
            )
    elif config.resume == RESUME_AUTO:
        if not directory:
            raise UsageError("--resume auto needs --checkpoint-dir DIR, the directory to look for checkpoints in")
    elif not os.path.isfile(os.path.join(config.resume, MANIFEST)):
        raise UsageError(
            f"--resume {config.resume} is not a checkpoint (no {MANIFEST} in it); give a "
            "checkpoint directory such as DIR/step-00000100, or --resume auto with --checkpoint-dir DIR"
        )
    elif (
        directory
        and list_checkpoints(directory)
        and (os.path.dirname(os.path.abspath(config.resume)) != os.path.abspath(directory))
    ):
        # Saving prunes and replaces the checkpoints in --checkpoint-dir: they must be this run's.
        raise UsageError(
            f"--checkpoint-dir {directory} holds checkpoints of another run than --resume "
            f"{config.resume}; resume from one of its own checkpoints, or choose an empty directory"
        )


def _parent_that_exists(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def verify_checkpoint(path: str) -> Checkpoint:
    """The checkpoint at `path` if its manifest parses and every listed file matches; else DamagedCheckpoint."""
    try:
        with open(os.path.join(path, MANIFEST)) as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{MANIFEST} is missing") from None
    except (OSError, ValueError) as exc:
        raise DamagedCheckpoint(f"{MANIFEST} is unreadable ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format_version") != FORMAT_VERSION:
        raise DamagedCheckpoint(f"{MANIFEST} is not a harness checkpoint manifest of format {FORMAT_VERSION}")
    try:
        int(manifest["step"])
        if not all(isinstance(manifest[key], dict) for key in ("config", "run", "progress")):
            raise TypeError("not a dict")
        files = {str(name): (int(entry["bytes"]), str(entry["sha256"])) for name, entry in manifest["files"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise DamagedCheckpoint(f"{MANIFEST} lacks its step, run facts or a well-formed file list") from None
    for relative, (expected_bytes, expected_sha256) in sorted(files.items()):
        file_path = os.path.join(path, relative)
        if not os.path.isfile(file_path):
            raise DamagedCheckpoint(f"{relative} is missing")
        size = os.path.getsize(file_path)
        if size != expected_bytes:
            raise DamagedCheckpoint(f"{relative} has {size} bytes, {expected_bytes} were written")
        if file_sha256(file_path) != expected_sha256:
            raise DamagedCheckpoint(f"{relative} does not match its checksum")
    return Checkpoint(path, manifest)


def find_resume_checkpoint(
    config: TrainConfig, layout: RunLayout, backend: type[Backend], warn: bool
) -> Optional[Checkpoint]:
    """The checkpoint this run continues from (None: start at step 0), checked against the run.

    `--resume auto` takes the newest valid checkpoint in --checkpoint-dir, printing a warning
    (when `warn`) for each newer damaged one it skips, and starts fresh if there is none.
    `--resume PATH` must name a valid checkpoint. Raises UsageError for an incompatible one.
    """
    if config.resume is None:
        return None
    if config.resume != RESUME_AUTO:
        try:
            checkpoint = verify_checkpoint(config.resume)
        except DamagedCheckpoint as exc:
            raise UsageError(
                f"checkpoint {config.resume} is damaged ({exc}); resume from another one, or use "
                "--resume auto to take the newest valid checkpoint"
            ) from None
    else:
        checkpoint = None
        for _, name in reversed(list_checkpoints(config.checkpoint_dir)):
            path = os.path.join(config.checkpoint_dir, name)
            try:
                checkpoint = verify_checkpoint(path)
                break
            except DamagedCheckpoint as exc:
                if warn:
                    print(
                        f"harness train: warning: skipping damaged checkpoint {path} ({exc})",
                        file=sys.stderr,
                        flush=True,
                    )
        if checkpoint is None:
            return None
    check_compatible(checkpoint, config, layout, backend, warn)
    return checkpoint


def check_compatible(
    checkpoint: Checkpoint, config: TrainConfig, layout: RunLayout, backend: type[Backend], warn: bool = False
) -> None:
    """Raise UsageError unless `checkpoint` can continue this run (same task, data, math, world);
    with `warn`, say so on stderr when the task's source changed since."""
    manifest, where = checkpoint.manifest, checkpoint.path
    fix = "use the checkpoint's settings, or start a new run with another --checkpoint-dir"
    saved_config = manifest.get("config", {})
    _check_task(checkpoint, layout, fix, warn)
    if manifest.get("checkpoint_format") != backend.checkpoint_format:
        raise UsageError(
            f"checkpoint {where} was written by backend {saved_config.get('backend')} "
            f"({manifest.get('checkpoint_format')} format) and cannot be loaded by {config.backend}; "
            f"resume with --backend {saved_config.get('backend')}, or {fix}"
        )
    for name in MUST_MATCH:
        if saved_config.get(name, TrainConfig.__dataclass_fields__[name].default) != getattr(config, name):
            flag = flag_name(name)
            raise UsageError(
                f"checkpoint {where} was written with {flag} {saved_config.get(name)} but this run has "
                f"{flag} {getattr(config, name)}; {fix}"
            )
    _check_backend_options(checkpoint, config, backend, fix)
    saved = manifest.get("run", {})
    if saved.get("world_size") != layout.world_size:
        raise UsageError(
            f"checkpoint {where} was written by {saved.get('world_size')} ranks but this job has "
            f"{layout.world_size} (data order and optimizer state depend on it); resume with "
            f"{saved.get('world_size')} ranks, or {fix}"
        )
    for name, label in (("global_batch", "global batch"), ("train_set_size", "training set size")):
        if saved.get(name) != getattr(layout, name):
            raise UsageError(
                f"checkpoint {where} was written with a {label} of {saved.get(name)} but this run has "
                f"{getattr(layout, name)}; {fix}"
            )
    if checkpoint.step >= layout.total_steps:
        raise UsageError(
            f"checkpoint {where} is at step {checkpoint.step}, the end of this run's "
            f"{layout.total_steps} steps; nothing is left to train (raise --epochs or --max-steps to "
            "train further, or use another --checkpoint-dir)"
        )


def _check_task(checkpoint: Checkpoint, layout: RunLayout, fix: str, warn: bool) -> None:
    """Raise UsageError if the checkpoint trained another task or the same with other arguments;
    with `warn`, say so if the task's source changed since."""
    saved = checkpoint.manifest.get("run", {}).get("task", {})
    now = layout.task
    if saved.get("spec") != now.get("spec"):
        raise UsageError(
            f"checkpoint {checkpoint.path} trained task {saved.get('spec')!r} but this run trains {now.get('spec')!r}; {fix}"
        )
    before, after = saved.get("args", {}), now.get("args", {})
    changed = sorted(key for key in {*before, *after} if before.get(key) != after.get(key))
    if changed:
        was = ", ".join(f"{key}={before.get(key)!r}" for key in changed)
        has = ", ".join(f"{key}={after.get(key)!r}" for key in changed)
        raise UsageError(
            f"checkpoint {checkpoint.path} was written with task arguments {was} but this run has {has}; {fix}"
        )
    if warn and saved.get("sha256") != now.get("sha256"):
        print(
            f"harness train: warning: the task's source changed since checkpoint {checkpoint.path} was written "
            "(another sha256); resuming with the source as it is now",
            file=sys.stderr,
            flush=True,
        )


def _check_backend_options(checkpoint: Checkpoint, config: TrainConfig, backend: type[Backend], fix: str) -> None:
    """Raise UsageError if an option that changes what `backend` saves or trains differs from the checkpoint's."""
    saved_config = checkpoint.manifest.get("config", {})
    # A checkpoint written by another backend of the same format ran with this backend's defaults.
    same_backend = saved_config.get("backend") == config.backend
    saved = backend.parse_options(saved_config.get("backend_options", {}) if same_backend else {})
    current = backend.parse_options(config.backend_options)
    for name in backend.Options.resume_must_match():
        if getattr(saved, name) != getattr(current, name):
            flag = backend.Options.flag(name)
            raise UsageError(
                f"checkpoint {checkpoint.path} was written with {flag} {getattr(saved, name)} but this "
                f"run has {flag} {getattr(current, name)}; {fix}"
            )


# -- per-rank state: RNGs as tensors and plain values, loadable with weights_only=True ---------
