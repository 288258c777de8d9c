"""Property 5 of harness check: only rank 0 writes files, and it saves the model to --save as a
state dict the plain model loads, with the weights the ranks ended with."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch

from ...tasks.models import WorkshopCNN
from .control import RunDirectory
from .reference import max_gap
from .todos import Failure


def _check_saved_model(path: Path, final: Optional[dict[str, torch.Tensor]]) -> Optional[str]:
    """What is wrong with the model file rank 0 saved, or None: it must load into the plain model
    (`workshop.build_model()`: its keys, whole tensors of its shapes) with the weights the ranks ended
    with. A wrapper's state dict (DDP's `module.` prefix), an FSDP shard or a DTensor would load into
    nothing an attendee evaluates later."""
    mesh_log = logging.getLogger("torch.distributed.device_mesh")  # warns when a DTensor's mesh unpickles
    level, mesh_log.level = mesh_log.level, logging.ERROR
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # any failure to load is the finding
        return f"its --save file {path.name} does not load outside the run ({type(error).__name__}: {error})"
    finally:
        mesh_log.setLevel(level)
    expected = WorkshopCNN(dropout=0.0).state_dict()
    if not isinstance(saved, dict) or not all(isinstance(value, torch.Tensor) for value in saved.values()):
        return f"its --save file {path.name} holds a {type(saved).__name__}, not a state dict of tensors"
    if set(saved) != set(expected):
        prefixed = sorted(name for name in saved if name not in expected)
        return (
            f"its --save file {path.name} has keys the plain model lacks ({', '.join(prefixed[:2])}"
            f"{' ...' if len(prefixed) > 2 else ''}): save the state dict of the model inside the wrapper"
        )
    for name, value in expected.items():
        tensor = saved[name]
        if type(tensor) is not torch.Tensor:  # a DTensor: this rank's pieces of a sharded weight
            return (
                f"its --save file {path.name} holds {name} as a {type(tensor).__name__}, the ranks' "
                "pieces of a sharded weight, not a whole tensor: gather the pieces of every rank before saving"
            )
        if tuple(tensor.shape) != tuple(value.shape):
            return (
                f"its --save file {path.name} holds {name} with shape {list(tensor.shape)}, not the whole "
                f"{list(value.shape)} tensor: gather the pieces of every rank before saving"
            )
    if final is not None and max_gap(saved, final) > 1e-6 * max(v.abs().max().item() for v in final.values()):
        return f"its --save file {path.name} does not hold the weights the ranks ended with"
    return None


def check_files(
    run: RunDirectory, ranks: int, save: str, final: Optional[dict[str, torch.Tensor]] = None
) -> list[Failure]:
    """Property 5."""
    failures = []
    for rank in range(1, ranks):
        written = sorted(
            str(path.relative_to(run.files(rank))) for path in run.files(rank).rglob("*") if path.is_file()
        )
        if written:
            failures.append(
                Failure(
                    "rank 0 writes",
                    f"rank {rank} wrote {', '.join(written[:3])}"
                    f"{' ...' if len(written) > 3 else ''}: only rank 0 writes files",
                    ("save",),
                )
            )
            break
    saved = run.files(0) / save
    if not saved.is_file():
        failures.append(Failure("rank 0 writes", f"rank 0 did not save the model to --save {save}", ("save",)))
    elif not failures:  # one line per property: a second writer is named first
        wrong = _check_saved_model(saved, final)
        if wrong:
            failures.append(Failure("rank 0 writes", f"rank 0 saved the model, but {wrong}", ("save",)))
    return failures
