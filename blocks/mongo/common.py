"""What filters and updates share: the refusal (:class:`MongoError`), SQL text with its bind
parameters (:class:`Sql`, named by :class:`Binds`), fields kept in columns of their own
(:class:`Column`), and how a dotted path is read (:func:`split_path`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["INDEX", "Binds", "Column", "MongoError", "Sql", "split_path", "to_json"]

#: A path segment that names a list index.
INDEX = re.compile(r"[0-9]+")


class MongoError(ValueError):
    """A filter or update document refused: ``location`` names where (``filter.a.$foo``)."""

    def __init__(self, location: str, message: str) -> None:
        super().__init__(f"{location}: {message}")
        self.location = location
        self.message = message


@dataclass
class Sql:
    """SQL text with ``:name`` bind parameters (for ``sqlalchemy.text``) and their values."""

    text: str
    params: dict[str, Any] = field(default_factory=dict)
    #: For an update: where each step's operator is (index 0: the source document).
    locations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Column:
    """A top-level field kept in its own column: ``sql`` names it, ``parse`` turns a value of
    the document into the column's (raising ``ValueError`` for one it cannot be)."""

    sql: str
    parse: Callable[[Any], Any]


class Binds:
    """Names bind parameters ``<prefix><n>`` and keeps their values."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.params: dict[str, Any] = {}

    def __call__(self, value: Any) -> str:
        name = f"{self.prefix}{len(self.params)}"
        self.params[name] = value
        return f":{name}"

    def jsonb(self, value: Any) -> str:
        return f"CAST({self(to_json(value))} AS jsonb)"

    def path(self, segments: Sequence[str]) -> str:
        return f"CAST({self(list(segments))} AS text[])"

    def jsonpath(self, text: str) -> str:
        return f"CAST({self(text)} AS jsonpath)"


def to_json(value: Any) -> str:
    """``value`` as JSON text; raises as :func:`json.dumps` does for what JSON cannot hold
    (a number that is not finite among them)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def split_path(path: str, location: str) -> tuple[str, ...]:
    """The segments of a dotted path; refused when one is empty, positional or an operator."""
    segments = tuple(path.split("."))
    for segment in segments:
        if not segment:
            raise MongoError(location, "a path has no empty segments")
        if segment.startswith("$"):
            raise MongoError(location, f"positional or operator segment {segment} not supported")
    return segments
