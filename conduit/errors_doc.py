"""The error reference, ``docs/reference/errors.md``, filled in from ``api.errors``' problem
classes each time the site is built, so it never lags the code: ``mkdocs.yml`` loads this
module as a hook, which replaces the page's marker with a table of every problem (its status,
title, ``code`` values, Retry-After, and its docstring: when it is answered).
``python -m conduit.errors_doc`` prints the same text."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from api.errors import Problem

MARKER = "<!-- problem-types -->"
RETRY_AFTER = {"always": "yes", "sometimes": "sometimes", "never": "no"}


def problems() -> list[type[Problem]]:
    """Every subclass of ``api.errors.Problem``, by status, then name."""
    from api.errors import Problem

    found: list[type[Problem]] = []
    pending = list(Problem.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: (cls.status, cls.__name__))


def when(cls: type[Problem]) -> str:
    """The class's own docstring, on one line, in Markdown."""
    doc = cls.__dict__.get("__doc__")
    if not doc:
        raise TypeError(f"{cls.__module__}.{cls.__name__} needs a docstring: when it is answered")
    return _cell(" ".join(inspect.cleandoc(doc).split()))


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def render() -> str:
    rows = [
        "| Status | Problem | `title` | `code` | Retry-After | When |",
        "|---|---|---|---|---|---|",
    ]
    for cls in problems():
        codes = ", ".join(f"`{code}`" for code in cls.codes) or "none"
        rows.append(
            f"| {cls.status} | `{cls.__name__}` | {_cell(cls.title)} | {codes} "
            f"| {RETRY_AFTER[cls.sends_retry_after]} | {when(cls)} |"
        )
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: the marker becomes the reference."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown


if __name__ == "__main__":
    print(render(), end="")
