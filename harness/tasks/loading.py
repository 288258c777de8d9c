"""From `--task SPEC` and its arguments to a `Task` on every rank, and what the record says of it.

A spec is a built-in task's name (`images`), `MODULE:FUNCTION` (imported with the working directory
on sys.path, as uvicorn and gunicorn do) or `path/to/file.py:FUNCTION`. Every rank resolves the
spec itself and calls the function with the task's arguments (`--task-arg KEY=VALUE`), so nothing
is pickled between processes and the task reaches every rank under any launcher. In Python a Task,
or a function that returns one, can be given directly (`harness.train(config, task=...)`): a
notebook's engines receive it with the call.

The record's `task` names the spec, the arguments and the source file with its sha256 (for a
function given directly: its module, and the sha256 of its source text), so that a study can be
rerun and compared. Every failure is one UsageError line that names the task and the fix.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import marshal
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from ..errors import UsageError, first_line, require
from .registry import builtin_tasks
from .task import Task, TaskFactory

KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the harness package: not the user's code
TaskLike = Union[str, Task, TaskFactory]


@dataclass
class LoadedTask:
    """A task ready for a run, and where it came from (the record's `task`)."""

    task: Task
    spec: str
    args: dict[str, Any] = field(default_factory=dict)
    source: Optional[str] = None
    sha256: Optional[str] = None
    builtin: bool = False

    @property
    def label(self) -> str:
        """How errors name the task: "task 'images'"."""
        return f"task {self.spec!r}"

    def origin(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "args": dict(self.args),
            "source": self.source,
            "sha256": self.sha256,
            "builtin": self.builtin,
            "name": self.task.name or self.spec,
        }


def check_spec(spec: str, args: Mapping[str, Any]) -> None:
    """What can be told of a spec without importing it: its form, and a built-in task's arguments."""
    if not isinstance(args, Mapping):
        raise UsageError(f"task {spec!r}: its arguments must be a dict of name to value, got {args!r}")
    builtin = builtin_tasks().get(spec)
    if builtin is not None:
        builtin.Options.parse(f"task {spec!r}", args)
        return
    target, separator, function = spec.rpartition(":")
    if not (separator and target and function.isidentifier()):
        known = ", ".join(builtin_tasks())
        raise UsageError(
            f"unknown task {spec!r}; choose a built-in task ({known}) or give MODULE:FUNCTION or path/to/file.py:FUNCTION"
        )


def load_task(task: TaskLike, args: Mapping[str, Any]) -> LoadedTask:
    """The Task of a spec (a string), of a factory (called with `args`) or a Task itself."""
    if isinstance(task, Task):
        task.check(f"task {task.name or 'object'!r}")
        return LoadedTask(task, task.name or "<Task object>", {}, builtin=False)
    if callable(task):
        spec = f"{getattr(task, '__module__', '?')}:{getattr(task, '__qualname__', repr(task))}"
        source, digest = _function_source(task)
        return LoadedTask(_call(task, dict(args), f"task {spec!r}"), spec, dict(args), source, digest)
    check_spec(task, args)
    builtin = builtin_tasks().get(task)
    if builtin is not None:  # its arguments recorded whole, defaults included
        full = builtin.Options.parse(f"task {task!r}", args).as_dict()
        return LoadedTask(_call(builtin.make, full, f"task {task!r}"), task, full, builtin=True)
    factory, source = import_factory(task)
    return LoadedTask(_call(factory, dict(args), f"task {task!r}"), task, dict(args), source, file_sha256(source))


def import_factory(spec: str) -> tuple[TaskFactory, str]:
    """The function a `MODULE:FUNCTION` or `FILE.py:FUNCTION` spec names, and its source file."""
    target, _, function = spec.rpartition(":")
    module = _load_file(spec, target) if target.endswith(".py") or os.sep in target else _import_module(spec, target)
    factory = getattr(module, function, None)
    if not callable(factory):
        defined = sorted(name for name, value in vars(module).items() if callable(value) and not name.startswith("_"))
        raise UsageError(
            f"task {spec!r}: {target} has no function {function!r} (it defines: {', '.join(defined) or 'nothing'}); "
            "fix --task"
        )
    return factory, os.path.abspath(getattr(module, "__file__", None) or target)


def _load_file(spec: str, path: str) -> Any:
    """The module of a task file, executed afresh (an edited file is read again by the next run).

    It is registered under the file's name with its folder on sys.path, so that classes it defines
    pickle by reference into data-loader workers started by spawn or forkserver."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise UsageError(f"task {spec!r}: file {path} does not exist; fix --task (a path, then :FUNCTION)")
    name = os.path.splitext(os.path.basename(path))[0]
    known = sys.modules.get(name)
    if known is not None and os.path.abspath(getattr(known, "__file__", "") or "") != path:
        name = f"harness_task_{hashlib.sha256(path.encode()).hexdigest()[:10]}_{name}"  # would shadow another module
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as exc:
        del sys.modules[name]
        raise UsageError(f"task {spec!r}: importing {path} raised {_where(exc, path)}; fix the file") from None
    return module


def _import_module(spec: str, name: str) -> Any:
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        return require(name, f"task {spec!r}", f"fix --task (imported from {here}), or give path/to/file.py:FUNCTION")
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"task {spec!r}: importing {name} raised {_where(exc, None)}; fix the module") from None
    finally:
        if added:
            sys.path.remove(here)


def _call(factory: TaskFactory, args: dict[str, Any], label: str) -> Task:
    """`factory(**args)`, checked: arguments it takes, no exception, a Task returned."""
    try:
        inspect.signature(factory).bind(**args)
    except TypeError:
        taken = ", ".join(inspect.signature(factory).parameters) or "none"
        given = ", ".join(sorted(args)) or "none"
        raise UsageError(f"{label} takes arguments {taken}, given {given}; fix --task-arg") from None
    except ValueError:  # a callable whose signature cannot be read: let the call say
        pass
    try:
        task = factory(**args)
    except UsageError as exc:
        raise UsageError(f"{label}: {exc}") from None
    except Exception as exc:
        call = f"{getattr(factory, '__name__', 'factory')}({', '.join(f'{k}={v!r}' for k, v in args.items())})"
        raise UsageError(f"{label}: {call} raised {_where(exc, None)}; fix the task or its --task-arg") from None
    if not isinstance(task, Task):
        raise UsageError(
            f"{label} returned a {type(task).__name__}, not a harness.Task; return "
            "Task(build_model=..., train_data=..., loss=...)"
        )
    task.check(label)
    return task


def _where(error: BaseException, path: Optional[str]) -> str:
    """ "ValueError: message (file.py line 12)": the error and the last line of user code it came from."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if not frame.filename.startswith(KIT)]
    if path is not None:
        frames = [frame for frame in frames if os.path.abspath(frame.filename) == path] or frames
    where = f" ({os.path.basename(frames[-1].filename)} line {frames[-1].lineno})" if frames else ""
    return f"{type(error).__name__}: {first_line(error)}{where}"


def file_sha256(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def _function_source(function: Callable[..., Any]) -> tuple[Optional[str], Optional[str]]:
    """A function's source file and the sha256 of its source text. A function sent from a notebook
    to its engines has no source there: then "<module>" and the sha256 of its compiled code, the
    same for the same cell on every engine."""
    try:
        text = inspect.getsource(function)
        source = inspect.getsourcefile(function)
    except (OSError, TypeError):
        code = getattr(function, "__code__", None)
        digest = hashlib.sha256(marshal.dumps(code)).hexdigest() if code is not None else None
        return f"<{getattr(function, '__module__', '?')}>", digest
    return source, hashlib.sha256(text.encode()).hexdigest()
