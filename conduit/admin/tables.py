"""How admin lists print: an aligned table for people, ``--json`` for scripts."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson


def table(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    lines = [tuple(columns), *(tuple(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    padded = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    return "\n".join(line.rstrip() for line in padded)


def to_json(value: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
