"""`harness train`'s flags: one per TrainConfig field, typed and documented from the dataclass, and
one per option of every registered backend, from the backend's Options dataclass.

Every backend's option flags are declared whichever backend runs, so `--help` lists them all (a
new backend's appear when it is registered) and a flag meant for another backend is refused with
a one-line UsageError naming that backend, instead of a bare "unrecognized arguments". The values
given for the chosen backend become `TrainConfig.backend_options`, which the backend parses.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from ..config import TrainConfig, flag_name
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
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), key: value})


def add_train_flags(parser: argparse.ArgumentParser, only: Optional[Sequence[str]] = None) -> None:
    """One flag per TrainConfig field (or per field named in `only`), typed and documented from the
    dataclass; in place of `backend_options`, one flag per option of every registered backend."""
    for spec in dataclasses.fields(TrainConfig):
        if only is not None and spec.name not in only:
            continue
        if spec.metadata.get("backend_flags"):
            add_backend_flags(parser)
            continue
        flag = flag_name(spec.name)
        help_text = spec.metadata["help"]
        if spec.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        if spec.type in ("dict[str, str]", dict[str, str]):
            parser.add_argument(
                flag, dest=spec.name, action=KeyValueAction, default={}, metavar="KEY=VALUE", help=help_text
            )
            continue
        kind = spec.metadata.get("type") or (str if spec.default is None else type(spec.default))
        parser.add_argument(
            flag,
            type=kind,
            default=spec.default,
            metavar=spec.name.upper(),
            help=f"{help_text} (default: {spec.default})",
        )


def _backend_option_fields() -> Iterator[tuple[str, dataclasses.Field]]:
    """(backend name, Options field) for every option of every registered backend."""
    from ..backends import BACKENDS

    for backend, cls in BACKENDS.items():
        for spec in dataclasses.fields(cls.Options):
            yield backend, spec


def _dest(backend: str, spec: dataclasses.Field) -> str:
    # Namespaced by backend: two backends may name an option alike.
    return f"{backend}.{spec.name}"


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per option of every registered backend, from the field's metadata (harness.backends.options).

    A flag that is not given leaves no attribute behind (default SUPPRESS), so `config_from_args`
    tells the flags given from the defaults, and the defaults stay the backend's own.
    """
    for backend, spec in _backend_option_fields():
        flag, help_text = spec.metadata["flag"], spec.metadata["help"]
        if spec.type in ("bool", bool):
            parser.add_argument(
                flag, dest=_dest(backend, spec), action="store_true", default=argparse.SUPPRESS, help=help_text
            )
            continue
        kind: type = spec.metadata["type"] or type(spec.default)
        parser.add_argument(
            flag,
            dest=_dest(backend, spec),
            type=kind,
            default=argparse.SUPPRESS,
            metavar=flag.lstrip("-").replace("-", "_").upper(),
            help=f"{help_text} (default: {spec.default})",
        )


def backend_options_given(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """The options of `backend` given as flags, by field name; a flag of another backend raises UsageError."""
    given = {}
    for owner, spec in _backend_option_fields():
        if not hasattr(args, _dest(owner, spec)):
            continue
        if owner != backend:
            raise UsageError(f"{spec.metadata['flag']} is a {owner} option; drop it or use --backend {owner}")
        given[spec.name] = getattr(args, _dest(owner, spec))
    return given


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig described by parsed train flags (defaults for fields the parser did not have);
    the chosen backend's option flags go into `backend_options`, over any it had already (--config)."""
    values = {
        spec.name: getattr(args, spec.name) for spec in dataclasses.fields(TrainConfig) if hasattr(args, spec.name)
    }
    given = backend_options_given(args, values.get("backend", TrainConfig.backend))
    if given:
        values["backend_options"] = {**values.get("backend_options", {}), **given}
    return TrainConfig(**values)


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `harness train --help`)")


def parse_train_flags(flags: Sequence[str]) -> TrainConfig:
    """The TrainConfig of `harness train` flags; a bad flag raises UsageError (one line, no exit)."""
    parser = _RaisingParser(prog="harness train", allow_abbrev=False)
    add_train_flags(parser)
    return config_from_args(parser.parse_args(list(flags)))
