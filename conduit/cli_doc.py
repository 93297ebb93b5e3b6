"""The command-line reference, ``docs/reference/cli.md``, filled in from ``conduit``'s own
parser each time the site is built, so it never lags the code: ``mkdocs.yml`` loads this
module as a hook, which replaces the page's marker with every command's ``--help``.
``python -m conduit.cli_doc`` prints the same text."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

MARKER = "<!-- cli-help -->"
#: Columns the help is wrapped to, whatever terminal builds the site.
WIDTH = "100"


def render() -> str:
    from conduit.cli import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parts = [
            f"## `{' '.join(path)}`\n\n```text\n{parser.format_help().rstrip()}\n```\n"
            for path, parser in _parsers(("conduit",), build_parser())
        ]
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(parts)


def _parsers(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, child in action.choices.items():
                if id(child) not in seen:  # an alias names a parser already listed
                    seen.add(id(child))
                    yield from _parsers((*path, name), child)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: the marker becomes the reference."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown


if __name__ == "__main__":
    print(render(), end="")
