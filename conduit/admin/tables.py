"""How admin commands print: lists as an aligned table for people or, with ``--json``, a
JSON array for scripts; ``show-*`` commands one JSON object."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TypeVar

import orjson

T = TypeVar("T")


def table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    lines = [tuple(columns), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    padded = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    return "\n".join(line.rstrip() for line in padded)


def to_json(value: object) -> str:
    """Dataclasses as objects, datetimes in ISO 8601."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def listing(
    items: Sequence[T],
    columns: Sequence[str],
    row: Callable[[T], Sequence[str]],
    *,
    as_json: bool,
    empty: str,
) -> str:
    """A list command's output: ``empty`` (a sentence) when there is nothing to list."""
    if as_json:
        return to_json(list(items))
    return table(columns, (row(item) for item in items)) if items else empty


def when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M") if moment is not None else "-"


def add_list_options(parser: argparse.ArgumentParser, limit: int = 1000) -> None:
    parser.add_argument("--json", action="store_true", help="print a JSON array, for scripts")
    parser.add_argument("--limit", type=int, default=limit, help="the newest N")
