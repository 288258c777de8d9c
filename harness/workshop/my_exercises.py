"""An attendee's own copy of an exercise step: `harness exercise start 02`.

exercises/ is generated from solutions/ (`make exercises` rewrites it, and `make test` fails when it
differs), so work done there is lost or breaks the tests. An attendee works on a copy in
my-exercises/ instead, which nothing in the kit writes or reads except this command: git ignores it,
the tests never collect it, and `make exercises` leaves it alone. `harness check` judges a copy as it
judges the exercise: it tells the step from the file name (02_ddp.py), so the copy keeps it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Optional, Union

from ..errors import UsageError, unknown_choice

KIT = Path(__file__).resolve().parent.parent.parent
EXERCISES = KIT / "exercises"
MY_EXERCISES = KIT / "my-exercises"
STEP_NAME = re.compile(r"^[0-9][0-9]_\w+$")  # the steps' names, as in solutions/: 02_ddp
# "exercises/02_ddp..." in a command of the exercise's text, not inside another path (my-exercises/).
EXERCISE_PATH = re.compile(r"(?<![\w./-])exercises/(?=[0-9][0-9]_)")
DISTRIBUTED_IMPORT = re.compile(r"^\s*(?:import|from)\s+(?:horovod|deepspeed|torch\.distributed)\b", re.M)


def exercise_steps(exercises: Path = EXERCISES) -> list[str]:
    """The steps there are exercises for, by name: ["01_serial", "02_ddp", ...]."""
    if not exercises.is_dir():
        raise UsageError(f"{exercises} is missing; run this from the kit's clone (make exercises writes it)")
    return sorted(path.stem for path in exercises.glob("*.py") if STEP_NAME.match(path.stem))


def resolve_step(step: str, exercises: Path = EXERCISES) -> str:
    """The step name that `step` means: "2", "02", "02_ddp", "02_ddp.py" or "ddp" -> "02_ddp"."""
    steps = exercise_steps(exercises)
    wanted = Path(str(step).strip()).name
    for suffix in (".py", ".ipynb"):
        wanted = wanted[: -len(suffix)] if wanted.endswith(suffix) else wanted
    for name in steps:
        number, _, title = name.partition("_")
        if wanted in (name, number, title) or (wanted.isdigit() and int(wanted) == int(number)):
            return name
    raise unknown_choice("exercise step", step, steps)


def _shown(directory: Path) -> str:
    """How the copy's own commands name `directory`: relative to the kit when inside it."""
    try:
        return directory.resolve().relative_to(KIT).as_posix()
    except ValueError:
        return str(directory)


def _from_here(path: Path) -> str:
    """`path` as the attendee's shell names it: relative to the current folder when inside it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _retarget(text: str, directory: Path) -> str:
    """The exercise's commands (`torchrun ... exercises/02_ddp.py`, `harness check ...`) aimed at the copy."""
    return EXERCISE_PATH.sub(f"{_shown(directory)}/", text)


def _notebook_copy(source: Path, directory: Path) -> str:
    """The exercise notebook with the commands in its cells aimed at the copy; the rest as it is."""
    notebook = json.loads(source.read_text())
    for cell in notebook.get("cells", []):
        text = cell.get("source", "")
        retargeted = _retarget("".join(text) if isinstance(text, list) else text, directory)
        cell["source"] = retargeted.splitlines(keepends=True) if isinstance(text, list) else retargeted
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def start_exercise(
    step: Union[str, int],
    notebook: bool = False,
    force: bool = False,
    directory: Optional[Union[str, os.PathLike]] = None,
    exercises: Union[str, os.PathLike] = EXERCISES,
) -> list[Path]:
    """Copy the exercise of `step` ("02", "02_ddp", "ddp") to DIRECTORY/NN_name.py (default
    my-exercises/ in the kit) for the attendee to work on, and with `notebook` also its .ipynb
    form. Returns the paths written. Raises UsageError for an unknown step, or when a copy is
    already there and `force` is not set (that copy is the attendee's work)."""
    exercises = Path(exercises)
    target = Path(directory) if directory is not None else MY_EXERCISES
    name = resolve_step(str(step), exercises)
    if target.resolve() == exercises.resolve():
        raise UsageError(
            f"{target} is the generated exercises/ folder; copy into my-exercises/ (leave out --directory)"
        )
    suffixes = [".py", ".ipynb"] if notebook else [".py"]
    sources = [exercises / f"{name}{suffix}" for suffix in suffixes]
    missing = [str(source) for source in sources if not source.is_file()]
    if missing:
        raise UsageError(f"{', '.join(missing)} missing; run `make exercises` to generate it")
    existing = [target / source.name for source in sources if (target / source.name).exists()]
    if existing and not force:
        shown = " and ".join(_from_here(path) for path in existing)
        one = len(existing) == 1
        raise UsageError(
            f"{shown} {'is' if one else 'are'} already there (your work); edit {'it' if one else 'them'}, "
            f"or pass --force to replace it with a fresh copy of exercises/{name}"
        )
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sources:
        text = _notebook_copy(source, target) if source.suffix == ".ipynb" else _retarget(source.read_text(), target)
        path = target / source.name
        path.write_text(text)
        written.append(path)
    return written


def start_command(step: str, notebook: bool = False, force: bool = False, directory: Optional[str] = None) -> int:
    """`harness exercise start STEP`: write the copy and say what to do next; returns 0."""
    written = start_exercise(step, notebook=notebook, force=force, directory=directory)
    script = _from_here(written[0])
    for path in written:
        print(f"wrote {_from_here(path)} (your copy of exercises/{path.name}; `make exercises` never touches it)")
    # harness check judges data-parallel scripts only; step 1 is serial.
    checked = DISTRIBUTED_IMPORT.search(written[0].read_text())
    print(
        f"next: python {script}   (it stops at the first TODO left to do)"
        + (f"; when all are done: harness check {script}" if checked else ""),
        flush=True,
    )
    return 0
