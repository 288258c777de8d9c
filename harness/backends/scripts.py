"""What `harness check` needs of a framework to watch an attendee's script that uses it itself,
rather than a backend: bounded collective waits, the engine configs it builds, the gradient
communications of its backward passes.

A collaborator of a backend (`Backend.script_hooks`), not part of its training interface: a
training run never calls these. Each framework's module subclasses ScriptHooks where it has
something to watch; the base watches nothing.
"""

from __future__ import annotations

from typing import Any, Callable

Function = Callable[..., Any]


class ScriptHooks:
    """A framework with nothing to watch: every hook does nothing."""

    @classmethod
    def limit_collective_waits(cls, seconds: float) -> None:
        """Make the framework's collectives in this process give up after `seconds` when a peer does
        not answer, for a script that uses the framework itself rather than this backend (`harness
        check` runs attendees' scripts so). Call it before the script starts the framework; it is
        process-wide and not undone (a backend's own run bounds its waits by --timeout in `init`)."""

    @classmethod
    def watch_engine_config(cls, record: Callable[[Any], None]) -> None:
        """Hand `record` the config of every engine a script in this process builds with the
        framework itself, before the framework reads it (`harness check` judges DeepSpeed's batch
        settings so). A framework without an engine config has nothing to watch."""

    @classmethod
    def watch_gradient_syncs(cls, record: Callable[[], None]) -> None:
        """Call `record` each time the framework, in a script in this process that uses it itself,
        issues one of the gradient communications of a backward pass (`harness check` counts the
        backward passes that communicated per optimizer step so). A framework whose gradient
        communications cannot be told apart from the script's own watches none."""


def recording(function: Function, record: Callable[[], None]) -> Function:
    """`function` (a library's function, or a method once set on its class), calling `record` first:
    what a `watch_gradient_syncs` puts in place of the call that starts a gradient communication."""

    def recorded(*args: Any, **kwargs: Any) -> Any:
        record()
        return function(*args, **kwargs)

    return recorded
