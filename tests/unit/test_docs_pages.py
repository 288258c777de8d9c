"""The README is a short front door and docs/ says the rest, in pages that stay true: the two
commands and the three ways in on the first screen, every page in the site's nav and every nav
entry a page, every `harness` command and every public name documented, every link to a file of
the kit pointing at one, and each "Files to touch" list (add a backend, a site, a notebook) holding
for every backend, site and notebook the kit has. In-process: the strict site build itself is
tests/integration/test_docs.py."""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import re

import pytest
import yaml

import harness
from harness.backends import BACKENDS
from harness.cli import build_parser
from harness.study.sites import SITES_DIR, site_names
from tests.conftest import REPO

DOCS = os.path.join(REPO, "docs")
README_WORD_LIMIT = 2000
FIRST_LINES = 10  # where the two make commands must be
FIRST_SCREEN = 25  # where the three ways in must be
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CODE_BLOCK = re.compile(r"^```.*?^```", re.S | re.M)


def _read(*path: str) -> str:
    with open(os.path.join(REPO, *path), encoding="utf-8") as handle:
        return handle.read()


def _hooks():
    """tools/docs_hooks.py, the MkDocs hook that adds WORKSHOP.md to the site."""
    spec = importlib.util.spec_from_file_location("docs_hooks", os.path.join(REPO, "tools", "docs_hooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _doc_pages() -> list[str]:
    return sorted(os.path.relpath(path, DOCS) for path in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


# --- the README --------------------------------------------------------------------------------


def test_the_readme_is_short():
    words = len(_read("README.md").split())
    assert words <= README_WORD_LIMIT, (
        f"README.md has {words} words; move detail into docs/ (limit {README_WORD_LIMIT})"
    )


def test_the_two_commands_open_the_readme():
    first = [line.split("#", 1)[0].strip() for line in _read("README.md").splitlines()[:FIRST_LINES]]
    assert "make demo" in first and "make test" in first, first


def test_the_three_ways_in_are_on_the_first_screen():
    screen = "\n".join(_read("README.md").splitlines()[:FIRST_SCREEN])
    assert "`make lab`" in screen
    check = screen.find("bash -l submissions/polaris.sc --check -- -A <project>")
    submit = screen.find("qsub -A <project> submissions/polaris.sc")
    assert 0 <= check < submit, "the instructor's qsub, with --check as the step before it"
    assert "`harness sweep --backends" in screen


@pytest.mark.parametrize("page", ["README.md", "WORKSHOP.md"] + [os.path.join("docs", p) for p in _doc_pages()])
def test_every_link_to_a_file_of_the_kit_finds_it(page):
    text = _CODE_BLOCK.sub("", _read(page))
    missing = []
    for target in _LINK.findall(text):
        path = target.split("#", 1)[0]
        if path and not re.match(r"[a-z][a-z0-9+.-]*:", path):
            if not os.path.exists(os.path.normpath(os.path.join(REPO, os.path.dirname(page), path))):
                missing.append(target)
    assert missing == [], f"{page} links to files that are not there: {missing}"


# --- the site's pages --------------------------------------------------------------------------


def test_every_nav_entry_is_a_page_and_every_page_is_in_the_nav():
    nav = _nav_pages(yaml.safe_load(_read("mkdocs.yml"))["nav"])
    generated = {_hooks().PAGE}
    assert sorted(set(nav) - generated) == _doc_pages()
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def _commands(parser: argparse.ArgumentParser, prefix: str = "harness") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [f"{prefix} {name}"] + _commands(sub, f"{prefix} {name}")
    return found


def test_every_command_is_in_the_cli_reference():
    page = _read("docs", "reference", "cli.md")
    commands = _commands(build_parser())
    assert "harness sweep" in commands and "harness bench allreduce" in commands
    missing = [command for command in commands if f"`{command}`" not in page]
    assert missing == [], f"docs/reference/cli.md does not document {missing}"


def test_every_public_name_is_in_the_api_reference():
    page = _read("docs", "reference", "api.md")
    missing = [name for name in harness.__all__ if not re.search(rf"`harness\.{re.escape(name)}\b", page)]
    assert missing == [], f"docs/reference/api.md does not document {missing}"


def test_workshop_md_joins_the_site_with_its_links_rewritten():
    rewrite = _hooks().workshop_page_markdown
    assert rewrite("[the README](README.md#notebooks)") == "[the README](index.md)"
    assert rewrite("[exercises](docs/tutorials/exercises.md#doing-an-exercise)") == (
        "[exercises](tutorials/exercises.md#doing-an-exercise)"
    )
    assert rewrite("[notebook 01](notebooks/01_data_parallelism.ipynb)") == (
        "notebook 01 (`notebooks/01_data_parallelism.ipynb`)"
    )
    assert rewrite("[gone](no/such/file.md)") == "[gone](no/such/file.md)"  # left for --strict to report
    assert rewrite("[site](https://example.org/a.md)") == "[site](https://example.org/a.md)"
    # the docs' pages link to the kit's WORKSHOP.md, which on the site is the page the hook adds
    aim = _hooks()._to_workshop_page
    assert (
        aim("[agenda](../../WORKSHOP.md#agenda)", "tutorials/workshop.md") == "[agenda](../workshop-agenda.md#agenda)"
    )
    assert aim("[agenda](../WORKSHOP.md)", "index.md") == "[agenda](workshop-agenda.md)"
    assert aim("[other](../README.md)", "index.md") == "[other](../README.md)"


# --- "Files to touch": add a backend, a site, a notebook ---------------------------------------


def _files_to_touch(page: str) -> list[tuple[str, list[str]]]:
    """Each bullet of the page's "Files to touch" section (up to the next "##" heading): its path or
    glob, with {placeholders}, and the values it says the file names ("which names `...`")."""
    text = _read("docs", "how-to", page)
    section = text[text.index("## Files to touch") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    bullets = re.findall(r"^- (.*(?:\n  .*)*)", section, re.M)
    assert bullets, f"docs/how-to/{page} lists no files to touch"
    parsed = []
    for bullet in bullets:
        bullet = " ".join(bullet.split())
        path = re.match(r"`([^`]+)`", bullet)
        assert path, f"docs/how-to/{page}: a bullet that does not start with a file: {bullet[:60]}"
        parsed.append((path.group(1), re.findall(r"which names `([^`]+)`", bullet)))
    return parsed


def _check_files(page: str, fields: dict[str, str]) -> list[str]:
    problems = []
    for pattern, names in _files_to_touch(page):
        path = pattern.format(**fields)
        matches = glob.glob(os.path.join(REPO, path))
        if not matches:
            problems.append(f"{path} is not there")
        for name in names:
            value = name.format(**fields)
            if matches and not any(value in open(match, encoding="utf-8").read() for match in matches):
                problems.append(f"{path} does not name {value!r}")
    return problems


@pytest.mark.parametrize("name", list(BACKENDS))
def test_add_a_backend_lists_the_files_every_backend_has(name):
    cls = BACKENDS[name]
    fields = {"name": name, "module": cls.__module__.rsplit(".", 1)[-1], "class": cls.__name__}
    assert _check_files("add-backend.md", fields) == []


@pytest.mark.parametrize("site", site_names())
def test_add_a_site_lists_the_files_every_site_has(site):
    assert os.path.exists(os.path.join(SITES_DIR, f"{site}.json"))
    assert _check_files("add-site.md", {"site": site}) == []


def test_every_job_template_runs_a_site_the_kit_has():
    templates = sorted(glob.glob(os.path.join(REPO, "submissions", "*.sc"))) + sorted(
        glob.glob(os.path.join(REPO, "submissions", "*.sbatch"))
    )
    assert templates
    for template in templates:
        named = re.findall(r"^exec python -m harness study --site (\S+)", _read(template), re.M)
        assert len(named) == 1 and named[0] in site_names(), f"{template}: its last line runs an unknown site {named}"


@pytest.mark.parametrize(
    "notebook", sorted(os.path.basename(path)[: -len(".ipynb")] for path in glob.glob(f"{REPO}/notebooks/*.ipynb"))
)
def test_add_a_notebook_lists_the_files_every_notebook_has(notebook):
    fields = {"notebook": notebook, "number": notebook.split("_", 1)[0]}
    assert _check_files("add-notebook.md", fields) == []
