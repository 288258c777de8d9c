"""The task of a study as its runs receive it: a spec that every run resolves itself
(harness.tasks.loading), and which task a record trained.

A sweep starts every run as a new process (on other nodes too), so a task reaches the runs by
name, never as an object:
- `sweep_spec`: what `run_sweep(settings, task=...)` gives every run as --task: a spec string as
  it is; a function returning a Task becomes MODULE:FUNCTION where it lives in a package (the
  name a new process imports it by), else /abs/path/FILE.py:FUNCTION. A Task object, a lambda, a
  function defined inside another or in a notebook or `__main__` has no such name: refused;
- `absolute_spec`, `absolute_task_flags`: a task file's relative path made absolute before the
  runs start, since they may start in another directory;
- `load_sweep_task`: the task loaded once in the sweep's own process before any run, so that a
  task that cannot load fails there with one line, not in every run;
- `task_arg_words`: the --task-arg flags that give back exactly a dict of arguments;
- `record_task`, `task_lines`: which task a record trained, to group records by and to report.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from ...errors import UsageError
from ...tasks.loading import LoadedTask, load_task
from ...tasks.task import Task
from ...training.flags import TaskArgAction, parse_train_flags

FILE_FORM = "FILE.py:FUNCTION"


def names_a_file(target: str) -> bool:
    """Whether a spec's part before the colon is a file (as harness.tasks.loading reads it), not a module."""
    return target.endswith(".py") or os.sep in target


def _refused(what: str) -> UsageError:
    return UsageError(
        f"task={what}: a sweep starts new processes, which find the task by name; define a function "
        f"returning the Task in a file and give task='{FILE_FORM}' (or that function)"
    )


def sweep_spec(task: Any) -> str:
    """The spec every run of a sweep loads `task` by: a spec string, or a task factory's own."""
    if isinstance(task, str):
        return task
    if isinstance(task, Task):
        raise _refused("a Task object")
    if not callable(task):
        raise UsageError(
            f"task= takes a spec string or a function returning a harness.Task, got a {type(task).__name__}"
        )
    module_name, name = getattr(task, "__module__", None), getattr(task, "__qualname__", "")
    module = sys.modules.get(module_name or "")
    path = getattr(module, "__file__", None) or ""
    if module_name == "__main__" or not name.isidentifier() or not path.endswith(".py"):
        raise _refused(f"{name or repr(task)} (defined in {module_name or 'no module'})")
    if module_name is None or getattr(module, name, None) is not task:
        raise _refused(f"{name} (not what {module_name}.{name} is now)")
    return f"{module_name}:{name}" if "." in module_name else f"{os.path.abspath(path)}:{name}"


def absolute_spec(spec: str, base: str) -> str:
    """`spec` with a task file's relative path made absolute against `base` (a module spec as it is)."""
    target, separator, function = spec.rpartition(":")
    if not (separator and names_a_file(target)):
        return spec
    return f"{os.path.abspath(os.path.join(base, os.path.expanduser(target)))}:{function}"


def absolute_task_flags(train_args: Sequence[str], base: str) -> list[str]:
    """`harness train` flags with the --task file made absolute against `base`."""
    flags = list(train_args)
    for index, word in enumerate(flags):
        if word == "--task" and index + 1 < len(flags):
            flags[index + 1] = absolute_spec(flags[index + 1], base)
        elif word.startswith("--task="):
            flags[index] = "--task=" + absolute_spec(word.split("=", 1)[1], base)
    return flags


def with_task(train_args: Sequence[str], task: Any) -> list[str]:
    """The flags with --task for `task` (a spec or a factory; see sweep_spec); refused beside another --task."""
    if any(word == "--task" or word.startswith("--task=") for word in train_args):
        raise UsageError("the task is given twice: as task= and as --task in train_args; give it once")
    return [*train_args, "--task", sweep_spec(task)]


def load_sweep_task(backend: str, train_args: Sequence[str]) -> LoadedTask:
    """The task the runs' flags name, loaded (and tried as harness.tasks.loading checks it) here."""
    config = parse_train_flags(["--backend", backend, *train_args])
    return load_task(config.task, config.task_args)


def task_arg_words(args: Mapping[str, Any]) -> list[str]:
    """--task-arg KEY=VALUE flags that `harness train` reads back as `args` (a string that would read
    as JSON, such as "64", goes as JSON text)."""
    words = []
    for key, value in args.items():
        plain = isinstance(value, str) and TaskArgAction.convert(value) == value
        words += ["--task-arg", f"{key}={value if plain else json.dumps(value)}"]
    return words


def parse_task_args(text: str, name: str = "TASK_ARGS") -> dict[str, Any]:
    """Space-separated KEY=VALUE words (VALUE read as JSON where it is JSON) as a dict."""
    args: dict[str, Any] = {}
    for word in text.split():
        key, separator, value = word.partition("=")
        if not (separator and key.isidentifier()):
            raise UsageError(f'{name} takes KEY=VALUE words separated by spaces, got {word!r}; e.g. {name}="width=64"')
        args[key] = TaskArgAction.convert(value)
    return args


class RecordTask(NamedTuple):
    """A record's task as reports group and title it."""

    key: str  # spec and arguments (canonical JSON): records of different keys never pool; "" before tasks
    label: str  # for a title: the spec's function and file name and the arguments; "" for a built-in task


def _args_text(args: Mapping[str, Any]) -> str:
    return " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(args.items()))


def record_task(record: Mapping[str, Any]) -> RecordTask:
    """Which task `record` trained (a record made before tasks existed: the empty key)."""
    task = record.get("task") or {}
    if not task.get("spec"):
        return RecordTask("", "")
    spec, args = str(task["spec"]), dict(task.get("args") or {})
    key = f"{spec} {json.dumps(args, sort_keys=True, default=str)}"
    if task.get("builtin"):
        return RecordTask(key, "")
    target, _, function = spec.rpartition(":")
    short = f"{os.path.basename(target)}:{function}" if names_a_file(target) else spec
    return RecordTask(key, " ".join(part for part in (short, _args_text(args)) if part))


def short_digest(text: str) -> str:
    """Six hex digits of `text`'s sha256: tells apart file names of studies of different tasks."""
    return hashlib.sha256(text.encode()).hexdigest()[:6]


def task_rows(records: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(spec, arguments, source, sha256's first 12 hex digits) of every task the records trained,
    each once, in order of first appearance; a built-in task's source is 'built in'."""
    rows: dict[tuple[str, str, str, str], None] = {}
    for record in records:
        task = record.get("task") or {}
        if not task.get("spec"):
            continue
        source = "built in" if task.get("builtin") else str(task.get("source") or "-")
        digest = str(task.get("sha256") or "-")[:12]
        rows[(str(task["spec"]), _args_text(task.get("args") or {}) or "-", source, digest)] = None
    return list(rows)


def task_lines(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per task the records trained: 'task SPEC ARGS (SOURCE, sha256 0123456789ab)'; two
    digests of one spec mean its file changed between runs."""
    return [
        f"task {spec}"
        + (f" {args}" if args != "-" else "")
        + (f" ({source}, sha256 {digest})" if digest != "-" else f" ({source})")
        for spec, args, source, digest in task_rows(records)
    ]
