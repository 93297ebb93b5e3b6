"""A filter's conditions (:mod:`blocks.mongo.filter_ast`) compiled to one SQL condition over a
JSONB expression, with its bind parameters.

Compiling never refuses: every check was made when the filter was read. A comparison with a
scalar is a SQL/JSON path predicate (``doc @? '$."a" ? (@ == "x")'``), which the GIN
``jsonb_path_ops`` index serves; equality with a document or a list is containment, confirmed
by exact equality (:func:`_equals_document`); a column is compared in its own column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, assert_never

from blocks.mongo.common import INDEX, Binds, to_json
from blocks.mongo.filter_ast import (
    And,
    ColumnCompare,
    ColumnNull,
    Compare,
    EqualsDocument,
    EqualsScalar,
    Exists,
    Filter,
    Not,
    Or,
    Regex,
    Scalar,
)

__all__ = ["compile_condition"]


def compile_condition(node: Filter, doc: str, binds: Binds) -> str:
    """The SQL condition (over the JSONB expression ``doc``) that ``node`` sets; its bind
    parameters are named by ``binds``, in the order the filter was written."""
    match node:
        case And(parts):
            texts = [compile_condition(part, doc, binds) for part in parts]
            return "(" + " AND ".join(texts) + ")" if texts else "TRUE"
        case Or(parts):
            texts = [compile_condition(part, doc, binds) for part in parts]
            return "(" + " OR ".join(texts) + ")" if texts else "FALSE"
        case Not(part):
            return f"(NOT {compile_condition(part, doc, binds)})"
        case ColumnNull(column, null):
            return f"({column.sql} IS NULL)" if null else f"({column.sql} IS NOT NULL)"
        case ColumnCompare(column, op, value):
            return f"({column.sql} {op} {binds(value)})"
        case EqualsDocument(path, value):
            return _equals_document(path, value, doc, binds)
        case _:
            return f"({doc} @? {binds.jsonpath(_path_predicate(node))})"


def _path_predicate(node: Exists | Compare | Regex | EqualsScalar) -> str:
    """The SQL/JSON path (with its filter) that the document matches when ``node`` holds."""
    match node:
        case Exists(path):
            return _jsonpath(path)
        case Compare(path, op, value):
            return f"{_jsonpath(path)} ? (@ {op} {_literal(value)})"
        case Regex(path, pattern, options):
            flags = f" flag {to_json(options)}" if options else ""
            return f"{_jsonpath(path)} ? (@ like_regex {to_json(pattern)}{flags})"
        case EqualsScalar(path, values):
            tests = " || ".join(f"@ == {_literal(value)}" for value in values)
            return f"{_jsonpath(path)} ? ({tests})"
        case _:
            assert_never(node)


def _literal(value: Scalar) -> str:
    """A scalar (a finite number, when a number) as a SQL/JSON path literal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        assert math.isfinite(value)
        return repr(value)
    return to_json(value)


def _jsonpath(segments: Sequence[str]) -> str:
    return "$" + "".join("." + to_json(segment) for segment in segments)


def _nest(segments: Sequence[str], value: Any) -> Any:
    for segment in reversed(segments):
        value = {segment: value}
    return value


def _equals_document(segments: Sequence[str], value: Any, doc: str, binds: Binds) -> str:
    """Equality with a document or a list: the value at the path, or an element of the list
    there. Containment (indexed) first, where the path names no list index."""
    at = f"({doc} #> {binds.path(segments)})"
    exact = f"({at} = {binds.jsonb(value)})"
    element = (
        f"EXISTS (SELECT 1 FROM jsonb_array_elements(CASE WHEN jsonb_typeof({at}) = 'array'"
        f" THEN {at} END) AS e(v) WHERE e.v = {binds.jsonb(value)})"
    )
    if not any(INDEX.fullmatch(segment) for segment in segments):
        exact = f"({doc} @> {binds.jsonb(_nest(segments, value))} AND {exact})"
        contains = binds.jsonb(_nest(segments, [value]))
        element = f"({doc} @> {contains} AND {element})"
    return f"({exact} OR {element})"
