"""A backend's own options: a small frozen dataclass declared in the backend's module.

Each backend class names its options dataclass `Options` (a subclass of `BackendOptions`), e.g.
`DDPBackend.Options(bucket_cap_mb=25.0)`. Every field is declared with `option`, whose metadata
holds the `harness train` flag and its help text, so the flags are generated from the dataclass
(harness.training.flags) and a new backend's flags appear when it is registered. A run carries
the chosen backend's values by field name in `TrainConfig.backend_options`; the backend parses
and validates them (`Backend.parse_options`) and records what it applied under `tuning`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from ..errors import UsageError

OptionsT = TypeVar("OptionsT", bound="BackendOptions")


def option(default: Any, flag: str, help: str, *, type: Optional[type] = None, resume_must_match: bool = False) -> Any:
    """A field of a backend's Options: its default, `harness train` flag and help text.

    `type` converts the flag's value where the default does not tell it (an Optional's None). A
    bool option is a switch (a flag without a value), so its default is False.
    `resume_must_match`: the value changes what the backend saves or trains, so a checkpoint
    resumes only with the value it was written with.
    """
    return field(
        default=default, metadata={"help": help, "flag": flag, "type": type, "resume_must_match": resume_must_match}
    )


@dataclass(frozen=True)
class BackendOptions:
    """The options of a backend that has none; each backend with options subclasses it.

    Subclasses are frozen dataclasses whose fields are all declared with `option`, and override
    `validate` (values that are malformed on their own) and, where some option changes what is
    communicated or saved, `examples` (what the contract tests run the backend with).
    """

    def validate(self) -> None:
        """Raise UsageError, naming the flag, for a value that is malformed on its own."""

    @classmethod
    def parse(cls: type[OptionsT], backend: str, values: Mapping[str, Any]) -> OptionsT:
        """Backend `backend`'s options with these values by field name, validated; an unknown name
        raises UsageError listing the backend's options."""
        if not isinstance(values, Mapping):
            raise UsageError(f"backend_options must map option names to values, got {values!r}")
        names = [spec.name for spec in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            known = f"its options are {', '.join(names)}" if names else "it has no options"
            raise UsageError(f"backend {backend!r} has no option {unknown[0]!r}; {known}")
        options = cls(**values)
        options.validate()
        return options

    @classmethod
    def flag(cls, name: str) -> str:
        """The `harness train` flag of field `name`, e.g. `--zero-stage`."""
        return {spec.name: spec.metadata["flag"] for spec in dataclasses.fields(cls)}[name]

    @classmethod
    def resume_must_match(cls) -> tuple[str, ...]:
        """Fields whose value changes what the backend saves or trains (see `option`)."""
        return tuple(spec.name for spec in dataclasses.fields(cls) if spec.metadata["resume_must_match"])

    @classmethod
    def examples(cls: type[OptionsT]) -> tuple[OptionsT, ...]:
        """The option sets the contract tests run this backend with (equivalence with one process,
        exact resume, ...): the defaults first, then each set that changes what is communicated or
        saved."""
        return (cls(),)

    def as_dict(self) -> dict[str, Any]:
        """Every field's value by name, as TrainConfig.backend_options holds them."""
        return dataclasses.asdict(self)

    def changed(self) -> dict[str, Any]:
        """The fields whose value is not the default, by name."""
        return {
            spec.name: getattr(self, spec.name)
            for spec in dataclasses.fields(self)
            if getattr(self, spec.name) != spec.default
        }

    def to_flags(self) -> list[str]:
        """The `harness train` flags that select these options (defaults are left out)."""
        flags: list[str] = []
        for name, value in self.changed().items():
            flags += [self.flag(name)] if value is True else [self.flag(name), str(value)]
        return flags
