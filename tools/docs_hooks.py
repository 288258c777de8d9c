"""MkDocs hook (mkdocs.yml `hooks:`): the attendees' start page, WORKSHOP.md, joins the site.

WORKSHOP.md lives at the top of the kit, where attendees find it on a clone, so it is not under
docs/. The site shows it as `workshop-agenda.md`, its links rewritten for where it now sits: a link
into docs/ points at that page of the site, a link to the README at the site's home, and a link to
another file of the kit (a notebook, a script) becomes the file's name in code, since the site does
not carry it. A link to nothing is left alone, so that `mkdocs build --strict` reports it. The
docs' own pages link to WORKSHOP.md by its place in the kit (`../WORKSHOP.md`), which works when
they are read on GitHub; on the site those links lead to the page.
"""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File

KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKSHOP = "WORKSHOP.md"
PAGE = "workshop-agenda.md"
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _rewrite(match: re.Match) -> str:
    bang, text, target = match.groups()
    path, _, anchor = target.partition("#")
    if not path or re.match(r"[a-z][a-z0-9+.-]*:", path):  # an anchor on the page, or a URL
        return match.group(0)
    path = os.path.normpath(path)
    if path == "README.md":
        return f"{bang}[{text}](index.md)"
    if path.startswith("docs" + os.sep) and os.path.exists(os.path.join(KIT, path)):
        return f"{bang}[{text}]({path[len('docs') + 1 :]}{'#' + anchor if anchor else ''})"
    if os.path.exists(os.path.join(KIT, path)):
        return f"{text} (`{path}`)" if text and text.strip("`") != path else f"`{path}`"
    return match.group(0)


def workshop_page_markdown(text: str) -> str:
    """WORKSHOP.md's Markdown with its links rewritten for the site's page `workshop-agenda.md`."""
    return _LINK.sub(_rewrite, text)


def _to_workshop_page(text: str, page_uri: str) -> str:
    """`text`, a page of docs/ at `page_uri`, with its links to the kit's WORKSHOP.md aimed at the site's page."""
    folder = os.path.dirname(page_uri)

    def rewrite(match: re.Match) -> str:
        bang, label, target = match.groups()
        path, _, anchor = target.partition("#")
        if not path or os.path.normpath(os.path.join("docs", folder, path)) != WORKSHOP:
            return match.group(0)
        return f"{bang}[{label}]({os.path.relpath(PAGE, folder or '.')}{'#' + anchor if anchor else ''})"

    return _LINK.sub(rewrite, text)


def on_page_markdown(markdown, page, config, files):
    """Aim a page's links to the kit's WORKSHOP.md at the site's page (MkDocs calls this per page)."""
    return _to_workshop_page(markdown, page.file.src_uri)


def on_files(files, config):
    """Add WORKSHOP.md to the site as `workshop-agenda.md` (MkDocs calls this once per build)."""
    with open(os.path.join(KIT, WORKSHOP), encoding="utf-8") as handle:
        content = workshop_page_markdown(handle.read())
    files.append(File.generated(config, PAGE, content=content))
    return files
