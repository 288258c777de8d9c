"""harness.process.environment.patched_environ: variables set and unset for a block are exactly as
before afterwards, after an exception and in nested blocks too; with `everything`, so is the rest
of the environment."""

from __future__ import annotations

import os

import pytest

from harness.process.environment import patched_environ

SET, UNSET, OTHER = "HARNESS_TEST_PATCH_SET", "HARNESS_TEST_PATCH_UNSET", "HARNESS_TEST_PATCH_OTHER"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    # A net under the helper: whatever a failing test leaves, monkeypatch takes away.
    monkeypatch.setenv(SET, "before")
    monkeypatch.setenv(UNSET, "present")
    monkeypatch.delenv(OTHER, raising=False)


def test_sets_and_unsets_for_the_block_then_restores():
    with patched_environ({SET: "inside", UNSET: None, OTHER: "new"}):
        assert (os.environ[SET], UNSET in os.environ, os.environ[OTHER]) == ("inside", False, "new")
    assert (os.environ[SET], os.environ[UNSET], OTHER in os.environ) == ("before", "present", False)


def test_restores_after_an_exception():
    with pytest.raises(ValueError):
        with patched_environ({SET: "inside", UNSET: None}):
            raise ValueError("inside")
    assert (os.environ[SET], os.environ[UNSET]) == ("before", "present")


def test_nested_blocks_restore_in_turn():
    with patched_environ({SET: "outer"}):
        with patched_environ({SET: "inner", UNSET: None}):
            assert os.environ[SET] == "inner" and UNSET not in os.environ
        assert (os.environ[SET], os.environ[UNSET]) == ("outer", "present")
    assert os.environ[SET] == "before"


def test_restores_the_names_it_changed_even_when_the_block_changed_them_again():
    with patched_environ({SET: "inside"}):
        os.environ[SET] = "changed by the block"
    assert os.environ[SET] == "before"


def test_everything_puts_back_what_the_block_itself_set_or_unset():
    with patched_environ(everything=True):
        os.environ[OTHER] = "set at import time by a library"
        del os.environ[UNSET]
        os.environ[SET] = "changed"
    assert (os.environ[SET], os.environ[UNSET], OTHER in os.environ) == ("before", "present", False)


def test_only_the_named_variables_are_restored_without_everything():
    with patched_environ({SET: "inside"}):
        os.environ[OTHER] = "kept"
    assert os.environ[OTHER] == "kept" and os.environ[SET] == "before"
