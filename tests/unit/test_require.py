"""harness.errors.require: a missing or broken optional library is a UsageError naming the install
step, the one way every optional import of the harness goes."""

from __future__ import annotations

import importlib.util

import pytest

from harness.data import builtin
from harness.errors import UsageError, require


def test_a_missing_library_names_the_install_step():
    with pytest.raises(
        UsageError, match=r"^plotting needs no_such_library_here, which is not installed; pip install x$"
    ):
        require("no_such_library_here.sub", "plotting", "pip install x")
    with pytest.raises(UsageError, match="which is not installed; pip install x"):
        require("no_such_library_here", "plotting", "pip install x", load=False)


def test_a_library_that_does_not_load_says_why(tmp_path, monkeypatch):
    (tmp_path / "half_built_library.py").write_text("raise ImportError('extension not built for this torch')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match=r"half_built_library cannot be loaded \(extension not built .*\); rebuild"):
        require("half_built_library", "the backend", "rebuild it")


def test_an_installed_library_is_returned_or_found():
    assert require("json", "reading", "pip install json").dumps([1]) == "[1]"
    assert require("json", "reading", "pip install json", load=False).name == "json"


def test_the_digits_without_scikit_learn_are_a_usage_error_naming_the_install(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == "sklearn" else find_spec(name, *rest)
    )
    monkeypatch.setattr(builtin, "_DIGITS_CACHE", {})
    with pytest.raises(UsageError, match="needs sklearn, which is not installed; pip install scikit-learn"):
        builtin.load_digits("train")
