"""`harness report --html`: one self-contained HTML file a person opens, of a scaling study.

It holds the report's tables (throughput and efficiency with their 95% intervals, POP metrics),
the figures as PNG embedded in base64 (no file beside it, nothing fetched from a network), the
prediction written before the runs beside what they measured (harness.study.prediction.foresight), the
environment (the task each run trained with its arguments and its source's sha256, versions,
site, hosts, each run's contention) and the commands that rerun the study
(a job directory's logs/commands.txt). Every job directory gets one as report.html.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any, Optional

from ...fileio import atomic_write
from .task_spec import task_rows

# A wide table scrolls inside its own box (.table), so the page never scrolls sideways.
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 72em; color: #222; }
.table { max-width: 100%; overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }
th { background: #eee; } td:first-child, th:first-child { text-align: left; }
td { white-space: nowrap; } li { margin: 0.3em 0; }
img { max-width: 100%; display: block; margin: 1em 0; }
pre { background: #f4f4f4; padding: 0.8em; overflow-x: auto; }
"""


def _inline(text: str) -> str:
    """One line of the report's Markdown as HTML: escaped, with **bold** and `code`."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)


def _markdown(text: str) -> str:
    """The report's Markdown (headings, pipe tables, lists, paragraphs) as HTML."""
    parts: list[str] = []
    table: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if table:
            parts.append(_table(table[0], table[1:]))
            table.clear()
        if items:
            parts.append("<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>")
            items.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= set("-: ") for cell in cells):
                table.append(cells)
            continue
        if line.startswith("- "):
            items.append(_inline(line[2:]))
            continue
        flush()
        if line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 4)
            parts.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            parts.append(f"<p>{_inline(line)}</p>")
    flush()
    return "\n".join(parts)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape('-' if c is None else str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f'<div class="table"><table><tr>{lines}</tr>{body}</table></div>'


def _figures(records: Sequence[dict[str, Any]]) -> str:
    from matplotlib import rc_context

    from .plot import SLIDE_STYLE, scaling_figures

    images = []
    with rc_context(SLIDE_STYLE):
        for key, figure in scaling_figures(records).items():
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
            encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
            images.append(f'<img alt="{html.escape(key)}" src="data:image/png;base64,{encoded}">')
    return "\n".join(images)


def _environment(records: Sequence[dict[str, Any]], directory: Optional[str]) -> str:
    versions: dict[str, set[str]] = {}
    for record in records:
        for name, version in (record.get("versions") or {}).items():
            versions.setdefault(name, set()).add(str(version))
    settings = {}
    if directory and os.path.exists(os.path.join(directory, "study.json")):
        with open(os.path.join(directory, "study.json")) as handle:
            settings = json.load(handle)
    study = _table(
        ["setting", "value"], sorted((k, v) for k, v in settings.items() if not isinstance(v, (dict, list)))
    )
    runs = _table(
        ["run", "backend", "ranks", "host", "repeat", "contended", "load average", "why"],
        (
            (
                str(r.get("run_id", ""))[:8],
                r.get("backend"),
                r.get("world_size"),
                r.get("host"),
                (r.get("tags") or {}).get("repeat"),
                (r.get("contention") or {}).get("flagged"),
                (r.get("contention") or {}).get("load_average"),
                "; ".join((r.get("contention") or {}).get("reasons", [])[:2]),
            )
            for r in records
        ),
    )
    listed = _table(["library", "version"], sorted((k, ", ".join(sorted(v))) for k, v in versions.items()))
    trained = task_rows(records)
    tasks = _table(["task", "arguments", "source", "sha256"], trained) if trained else ""
    return f"<h2>Environment</h2>{tasks}{listed}{study if settings else ''}<h3>Each run and its contention</h3>{runs}"


def _commands(directory: Optional[str]) -> str:
    path = os.path.join(directory, "logs", "commands.txt") if directory else ""
    if not path or not os.path.exists(path):
        return "<h2>Commands</h2><p>No logs/commands.txt here: each record's config holds its run's settings.</p>"
    with open(path) as handle:
        return f"<h2>Commands that rerun the study</h2><pre>{html.escape(handle.read())}</pre>"


def study_title(records: Sequence[dict[str, Any]]) -> str:
    """The report's title: its study's own (e.g. 'Weak scaling: cnn on digits, 64 samples per worker
    (cpu)'), the first of several with how many more."""
    from .report import scaling_rows

    titles = sorted({row.study.title() for row in scaling_rows(records)})
    if not titles:
        return "Scaling study"
    return titles[0] + (f" (and {len(titles) - 1} more studies)" if len(titles) > 1 else "")


def html_report(
    records: Sequence[dict[str, Any]], directory: Optional[str] = None, title: Optional[str] = None
) -> str:
    """The whole report as one HTML document (str), titled `title` or its study's (`study_title`):
    the tables with every caveat and the definitions, figures, and for `directory` (a job directory)
    its prediction, study settings and commands. Raises UsageError where no record has a timed window."""
    from ..prediction.foresight import prediction_markdown, prediction_rows
    from .report import scaling_report

    title = title or study_title(records)
    predicted = prediction_rows(directory, records) if directory else []
    sections = [
        _markdown(scaling_report(records, explain=True)),
        "<h2>Figures</h2>" + _figures(records),
        "<h2>Predicted before the runs, and measured</h2>"
        + (
            _markdown(prediction_markdown(predicted))
            if predicted
            else "<p>No prediction was written for these runs.</p>"
        ),
        _environment(records, directory),
        _commands(directory),
    ]
    body = "\n".join(sections)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def write_html_report(records: Sequence[dict[str, Any]], path: str, directory: Optional[str] = None) -> str:
    """Write html_report(...) to `path` atomically; returns the path."""
    document = html_report(records, directory)

    def write(tmp: str) -> None:
        with open(tmp, "w") as handle:
            handle.write(document)
        os.chmod(tmp, 0o644)  # a report is for reading: not the private mode of a temporary file

    atomic_write(path, write)
    return path
