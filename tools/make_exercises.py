"""Write exercises/ from solutions/ (`make exercises`); with --check, only say whether they differ.

For each solutions/NN_name.py it writes
- exercises/NN_name.py: the solution with each TODO block's code replaced by `workshop.todo(N, ...)`
  (harness.workshop.exercise.exercise_text has the convention), and the commands in its text pointing at
  the exercise instead of the solution;
- exercises/NN_name.ipynb: the same as a notebook for JupyterLab (the .py files are jupytext
  percent scripts: `# %%` starts a cell), with a last cell that says how to run it on 2 ranks.
exercises/ is generated: its files are the ones named like a step (NN_name.py, NN_name.ipynb), and
one of those whose solution is gone is removed. Any other file there is left alone, and attendees'
copies in my-exercises/ (`harness exercise start 02`) are never written: this refuses to write there.
A test (tests/integration/test_exercises.py) runs --check, so exercises/ never drifts from solutions/.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Optional

import jupytext
import nbformat

from harness.workshop.exercise import exercise_text

REPO = Path(__file__).resolve().parent.parent
# What this script writes (and so may rewrite or remove), the names of solutions/ steps: 02_ddp.py.
GENERATED = re.compile(r"^[0-9][0-9]_\w+\.(?:py|ipynb)$")
ATTENDEES = "my-exercises"  # harness.workshop.my_exercises writes attendees' copies there

NOTEBOOK_NOTE = """Running these cells runs one rank (a world of size 1): enough to step through the code.
To run the script on 2 ranks, check it from a terminal: `harness check exercises/{name}.ipynb`
reads the notebook. To launch it yourself, write it out as a script first:
`jupytext --to py exercises/{name}.ipynb -o my_{name}.py`, then run that as the first cell says."""
KERNEL = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def exercise_script(solution: Path) -> str:
    """The exercise of one solution file, its own path in the run commands changed to exercises/."""
    text = exercise_text(solution.read_text(), solution.name)
    own = f"solutions/{solution.name}"
    return (
        "\n".join(
            line if "diff " in line else line.replace(own, f"exercises/{solution.name}") for line in text.splitlines()
        )
        + "\n"
    )


def exercise_notebook(script: str, name: str) -> str:
    """The notebook form of an exercise script, without jupytext's own metadata (stable across versions)."""
    notebook = jupytext.reads(script, fmt="py:percent")
    notebook.cells.append(nbformat.v4.new_markdown_cell(NOTEBOOK_NOTE.format(name=name)))
    notebook.metadata = nbformat.from_dict(KERNEL)
    for number, cell in enumerate(notebook.cells):
        cell.metadata = {}
        cell.id = f"{name}-{number}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nbformat.writes(notebook) + "\n"


def generated(solutions: Path) -> dict[str, str]:
    """File name -> content of everything exercises/ must hold."""
    files = {}
    for solution in sorted(solutions.glob("[0-9][0-9]_*.py")):
        script = exercise_script(solution)
        files[solution.name] = script
        files[f"{solution.stem}.ipynb"] = exercise_notebook(script, solution.stem)
    return files


def stale_files(expected: dict[str, str], exercises: Path) -> list[str]:
    """The generated files in `exercises` to write (missing or different) or remove (no solution
    makes them any more); files not named like a step are not the generator's and never listed."""
    present = (
        {path.name for path in exercises.glob("*") if path.is_file() and GENERATED.match(path.name)}
        if exercises.is_dir()
        else set()
    )
    return sorted(
        name
        for name in set(expected) | present
        if name not in present or name not in expected or (exercises / name).read_text() != expected[name]
    )


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solutions", type=Path, default=REPO / "solutions")
    parser.add_argument("--exercises", type=Path, default=REPO / "exercises")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ differs")
    args = parser.parse_args(argv)
    try:
        expected = generated(args.solutions)
    except ValueError as error:  # a malformed TODO block
        print(f"make_exercises: error: {error}", file=sys.stderr)
        return 2
    if args.exercises.resolve().name == ATTENDEES:
        print(
            f"make_exercises: error: {args.exercises} holds attendees' copies; give --exercises exercises/ "
            "(the generated folder)",
            file=sys.stderr,
        )
        return 2
    stale = stale_files(expected, args.exercises)
    if args.check:
        if stale:
            print(
                f"exercises differ from what {args.solutions} generate: {', '.join(stale)}; run `make exercises` "
                f"(if you edited one, move it to {ATTENDEES}/ first, where `harness exercise start NN` puts your copies)"
            )
            return 1
        return 0
    args.exercises.mkdir(exist_ok=True)
    for name in stale:
        target = args.exercises / name
        if name in expected:
            target.write_text(expected[name])
        else:
            target.unlink()
    print(f"exercises: {len(expected)} files from {args.solutions}, {len(stale)} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
