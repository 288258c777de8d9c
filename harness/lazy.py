"""Public names of a package that load their module on first use.

Each layer package lists its public API in its `__init__` as `name -> submodule`. Importing the
package stays cheap (`import harness` and `harness --help` load no torch), and the configuration
can import a leaf module of a layer without loading that layer's heavy modules first.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package` that import `package.table[name]` when `name` is read."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{table[name]}"), name)

    def __dir__() -> list[str]:
        return sorted(table)

    return __getattr__, __dir__
