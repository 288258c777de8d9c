"""The options of a registered part, a backend or a built-in task: a small frozen dataclass.

A backend class names its options dataclass `Options` (a subclass of `BaseOptions` here), e.g.
`DDPBackend.Options(bucket_cap_mb=25.0)`; a built-in task declares one the same way
(harness.tasks.images.ImageOptions). Every field is declared with `option`, whose metadata holds
the `harness train` flag and its help text, so the flags are generated from the dataclass
(harness.training.flags) and a new part's flags appear when it is registered. A run carries the
chosen backend's values by field name in `TrainConfig.backend_options` and the task's in
`TrainConfig.task_args`; the part parses and validates them (`Options.parse`) and records them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from .errors import UsageError

OptionsT = TypeVar("OptionsT", bound="BaseOptions")


def option(default: Any, flag: str, help: str, *, type: Optional[type] = None, resume_must_match: bool = False) -> Any:
    """A field of an Options dataclass: its default, `harness train` flag and help text.

    `type` converts the flag's value where the default does not tell it (an Optional's None). A
    bool option is a switch (a flag without a value), so its default is False.
    `resume_must_match`: the value changes what a backend saves or trains, so a checkpoint
    resumes only with the value it was written with (a task's arguments must all match).
    """
    return field(
        default=default, metadata={"help": help, "flag": flag, "type": type, "resume_must_match": resume_must_match}
    )


@dataclass(frozen=True)
class BaseOptions:
    """The options of a part that has none; each part with options subclasses it.

    Subclasses are frozen dataclasses whose fields are all declared with `option`, and override
    `validate` (values that are malformed on their own) and, where some option changes what is
    communicated or saved, `examples` (what the contract tests run the part with).
    """

    def validate(self) -> None:
        """Raise UsageError, naming the flag, for a value that is malformed on its own."""

    @classmethod
    def parse(cls: type[OptionsT], owner: str, values: Mapping[str, Any]) -> OptionsT:
        """The options of `owner` (e.g. "backend 'ddp'") with these values by field name,
        validated; an unknown name raises UsageError listing the owner's options."""
        if not isinstance(values, Mapping):
            raise UsageError(f"the options of {owner} must map option names to values, got {values!r}")
        names = [spec.name for spec in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            known = f"its options are {', '.join(names)}" if names else "it has no options"
            raise UsageError(f"{owner} has no option {unknown[0]!r}; {known}")
        options = cls(**values)
        options.validate()
        return options

    @classmethod
    def flag(cls, name: str) -> str:
        """The `harness train` flag of field `name`, e.g. `--zero-stage`."""
        return {spec.name: spec.metadata["flag"] for spec in dataclasses.fields(cls)}[name]

    @classmethod
    def resume_must_match(cls) -> tuple[str, ...]:
        """Fields whose value changes what a backend saves or trains (see `option`)."""
        return tuple(spec.name for spec in dataclasses.fields(cls) if spec.metadata["resume_must_match"])

    @classmethod
    def examples(cls: type[OptionsT]) -> tuple[OptionsT, ...]:
        """The option sets the contract tests run this part with (equivalence with one process,
        exact resume, ...): the defaults first, then each set that changes what is communicated or
        saved."""
        return (cls(),)

    def as_dict(self) -> dict[str, Any]:
        """Every field's value by name, as TrainConfig.backend_options (or task_args) holds them."""
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
