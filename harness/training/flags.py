"""`harness train`'s flags: one per TrainConfig field, typed and documented from its section and
grouped by section in `--help`; one per option of every registered backend (its Options
dataclass); one per argument of every built-in task (its Options dataclass).

Every backend's and built-in task's flags are declared whichever one runs, so `--help` lists them
all (a new one's appear when it is registered) and a flag meant for another backend or task is
refused with a one-line UsageError naming it, instead of a bare "unrecognized arguments". The
values given for the chosen backend become `TrainConfig.backend_options`; for the chosen task,
`TrainConfig.task_args` (with any `--task-arg KEY=VALUE`), which the task's function receives.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from ..config import SECTIONS, TrainConfig, flag_name
from ..errors import UsageError


class KeyValueAction(argparse.Action):
    """Collect repeated KEY=VALUE flags into one dict (a later KEY replaces an earlier one)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        key, separator, value = str(values).partition("=")
        if not separator or not key:
            parser.error(f"{option_string} takes KEY=VALUE, got {values!r}")
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), key: self.convert(value)})

    @staticmethod
    def convert(value: str) -> Any:
        return value


class TaskArgAction(KeyValueAction):
    """--task-arg KEY=VALUE: VALUE read as JSON where it is JSON (64, 0.5, true, [1, 2]), else a string."""

    @staticmethod
    def convert(value: str) -> Any:
        try:
            return json.loads(value)
        except ValueError:
            return value


def add_train_flags(parser: argparse.ArgumentParser, only: Optional[Sequence[str]] = None) -> None:
    """One flag per TrainConfig field (or per field named in `only`), typed and documented from its
    section, one group of flags per section; in place of `backend_options`, one flag per option of
    every registered backend, and beside `task_args` one per argument of every built-in task."""
    for section in SECTIONS:
        names = [spec.name for spec in dataclasses.fields(section) if only is None or spec.name in only]
        if not names:
            continue
        title = section.__name__.removesuffix("Section").lower()
        group = parser.add_argument_group(title, (section.__doc__ or "").splitlines()[0])
        for name in names:
            _add_field_flag(group, TrainConfig.__dataclass_fields__[name])


def _add_field_flag(parser: Any, spec: dataclasses.Field) -> None:
    """The flag of one TrainConfig field (a section's field)."""
    if spec.metadata.get("backend_flags"):
        add_backend_flags(parser)
        return
    flag = flag_name(spec.name)
    help_text = spec.metadata["help"]
    if spec.type in ("bool", bool):
        parser.add_argument(flag, action="store_true", help=help_text)
        return
    if spec.name == "task_args":
        parser.add_argument(
            flag, dest=spec.name, action=TaskArgAction, default={}, metavar="KEY=VALUE", help=help_text
        )
        add_task_flags(parser)
        return
    if spec.type in ("dict[str, str]", dict[str, str]):
        parser.add_argument(
            flag, dest=spec.name, action=KeyValueAction, default={}, metavar="KEY=VALUE", help=help_text
        )
        return
    kind = spec.metadata.get("type") or (str if spec.default is None else type(spec.default))
    parser.add_argument(
        flag, type=kind, default=spec.default, metavar=spec.name.upper(), help=f"{help_text} (default: {spec.default})"
    )


def _backend_option_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(backend name, Options field) for every option of every registered backend."""
    from ..backends import BACKENDS

    for backend, cls in BACKENDS.items():
        for spec in dataclasses.fields(cls.Options):
            yield backend, spec


def _task_option_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(task name, Options field) for every argument of every built-in task."""
    from ..tasks.registry import builtin_tasks

    for task, builtin in builtin_tasks().items():
        for spec in dataclasses.fields(builtin.Options):
            yield task, spec


def _dest(owner: str, spec: dataclasses.Field) -> str:
    # Namespaced by owner: two backends (or tasks) may name an option alike.
    return f"{owner}.{spec.name}"


def _add_option_flags(parser: Any, fields: Iterator[tuple[str, dataclasses.Field]]) -> None:
    """One flag per Options field (harness.options). A flag that is not given leaves no attribute
    behind (default SUPPRESS), so the flags given are told from the defaults, which stay the owner's."""
    for owner, spec in fields:
        flag, help_text = spec.metadata["flag"], spec.metadata["help"]
        if spec.type in ("bool", bool):
            parser.add_argument(
                flag, dest=_dest(owner, spec), action="store_true", default=argparse.SUPPRESS, help=help_text
            )
            continue
        kind: type = spec.metadata["type"] or type(spec.default)
        parser.add_argument(
            flag,
            dest=_dest(owner, spec),
            type=kind,
            default=argparse.SUPPRESS,
            metavar=flag.lstrip("-").replace("-", "_").upper(),
            help=f"{help_text} (default: {spec.default})",
        )


def add_backend_flags(parser: Any) -> None:
    """One flag per option of every registered backend."""
    _add_option_flags(parser, _backend_option_fields())


def add_task_flags(parser: Any) -> None:
    """One flag per argument of every built-in task."""
    _add_option_flags(parser, _task_option_fields())


def _given(
    args: argparse.Namespace, fields: Iterator[tuple[str, dataclasses.Field]], chosen: str, refuse: Any
) -> dict:
    """The options of `chosen` given as flags, by field name; a flag of another owner: `refuse(owner, flag)`."""
    given = {}
    for owner, spec in fields:
        if not hasattr(args, _dest(owner, spec)):
            continue
        if owner != chosen:
            raise UsageError(refuse(owner, spec.metadata["flag"]))
        given[spec.name] = getattr(args, _dest(owner, spec))
    return given


def backend_options_given(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The options of `backend` given as flags, by field name; a flag of another backend raises UsageError."""
    return _given(
        args,
        _backend_option_fields(),
        backend,
        lambda owner, flag: f"{flag} is a {owner} option; drop it or use --backend {owner}",
    )


def task_options_given(args: argparse.Namespace, task: str) -> dict[str, Any]:
    """The arguments of built-in task `task` given as flags; a flag of another task raises UsageError."""
    return _given(
        args,
        _task_option_fields(),
        task,
        lambda owner, flag: (
            f"{flag} is an argument of task {owner}; drop it or use --task {owner} "
            "(a task of your own takes --task-arg KEY=VALUE)"
        ),
    )


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig described by parsed train flags (defaults for fields the parser did not have);
    the chosen backend's option flags go into `backend_options` and the chosen built-in task's
    into `task_args`, over any they had already (--config)."""
    values = {
        spec.name: getattr(args, spec.name) for spec in dataclasses.fields(TrainConfig) if hasattr(args, spec.name)
    }
    for field_name, given in (
        ("backend_options", backend_options_given(args, values.get("backend", TrainConfig.backend))),
        ("task_args", task_options_given(args, values.get("task", TrainConfig.task))),
    ):
        if given:
            values[field_name] = {**values.get(field_name, {}), **given}
    return TrainConfig(**values)


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `harness train --help`)")


def parse_train_flags(flags: Sequence[str]) -> TrainConfig:
    """The TrainConfig of `harness train` flags; a bad flag raises UsageError (one line, no exit)."""
    parser = _RaisingParser(prog="harness train", allow_abbrev=False)
    add_train_flags(parser)
    return config_from_args(parser.parse_args(list(flags)))
