"""MongoDB-style filters and update documents, translated to SQL over a JSONB column.

Nothing here touches a database or loads a row: each function reads a document and returns SQL
text with its bind parameters (:class:`Sql`), which Postgres evaluates. A document this module
cannot translate (an unknown operator, a value of the wrong kind, two updates of one path) is
refused with :class:`MongoError`, which names where it is (``filter.a.$foo``); nothing is
ignored.

Filters (:func:`compile_filter`): dotted-path equality, ``$eq``, ``$ne``, ``$in``, ``$nin``,
``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$exists``, ``$regex`` (with ``$options`` ``i``, ``m``,
``s``, ``x``: a SQL/JSON ``like_regex``, POSIX regular expressions), ``$and``, ``$or``,
``$nor``; at most :data:`MAX_LIST` values in one ``$in`` and :data:`MAX_TERMS` conditions in
all, nested at most ``core.nesting.MAX_DEPTH`` deep. A comparison with a scalar is a SQL/JSON
path predicate, ``doc @? '$."a"."b" ? (@ ==
"x")'``: in the lax mode a member accessor steps into arrays and a filter tests each element,
which is MongoDB's own reading (``{"tags": "NLP"}`` matches a list holding "NLP"; ``a.b``
reaches into a list of documents), and the operator is one the GIN ``jsonb_path_ops`` index
serves. Equality with a document or a list is containment (``doc @> {"a": {"b": v}}``, indexed)
confirmed by exact equality at the path, or an element of a list at the path equal to it.
``null`` matches a missing field too, as in MongoDB. Some fields may live in their own columns
(:class:`Column`), compared there.

Updates (:mod:`blocks.mongo.updates`): ``$set`` (dotted paths, creating
missing documents on the way), ``$unset``, ``$inc``, ``$push`` and ``$addToSet`` (a value or
``{"$each": [...]}``), ``$pull`` (a value, or a condition of the comparison operators above).
Each operator is one step of a chain of ``CROSS JOIN LATERAL`` subqueries, each a ``jsonb_set``
/ ``#-`` / ``||`` expression over the previous step's document, so that the whole update is
one expression of the row evaluated in one statement (the caller's ``UPDATE`` locks the row).
A step that meets a value it cannot apply to (``$inc`` of a string, ``$push`` to a non-list, a
path through a string) yields NULL; the select reports the first such step, whose location
the caller answers with, and stores nothing. Differences from MongoDB: an index past the end
of a list in ``$set`` appends rather than pads with nulls; positional paths (``a.$``,
``a.$[]``) and the other update operators are refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.nesting import TooDeep, check_depth

__all__ = [
    "COMPARISONS",
    "FILTER_OPERATORS",
    "UPDATE_OPERATORS",
    "Column",
    "MongoError",
    "Sql",
    "compile_filter",
]

COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
FILTER_OPERATORS = frozenset(
    {"$eq", "$ne", "$in", "$nin", "$exists", "$regex", "$options", *COMPARISONS}
)
#: The flags ``$options`` may hold (those ``like_regex`` takes).
REGEX_FLAGS = frozenset("imsx")
LOGICAL = frozenset({"$and", "$or", "$nor"})
#: Most values one ``$in`` or ``$nin`` may list.
MAX_LIST = 1000
#: Most comparisons and logical operators one filter may hold (each value of an ``$in``
#: counts): past a few thousand, Postgres refuses the statement as too complex.
MAX_TERMS = 2000
UPDATE_OPERATORS = frozenset({"$set", "$unset", "$inc", "$push", "$addToSet", "$pull"})
_INDEX = re.compile(r"[0-9]+")


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


class _Binds:
    """Names bind parameters ``<prefix><n>`` and keeps their values."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.params: dict[str, Any] = {}

    def __call__(self, value: Any) -> str:
        name = f"{self.prefix}{len(self.params)}"
        self.params[name] = value
        return f":{name}"

    def jsonb(self, value: Any) -> str:
        return f"CAST({self(_json(value))} AS jsonb)"

    def path(self, segments: Sequence[str]) -> str:
        return f"CAST({self(list(segments))} AS text[])"

    def jsonpath(self, text: str) -> str:
        return f"CAST({self(text)} AS jsonpath)"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _split(path: str, location: str) -> tuple[str, ...]:
    segments = tuple(path.split("."))
    for segment in segments:
        if not segment:
            raise MongoError(location, "a path has no empty segments")
        if segment.startswith("$"):
            raise MongoError(location, f"positional or operator segment {segment} not supported")
    return segments


# -- filters ----------------------------------------------------------------------------------


def compile_filter(
    document: Any,
    doc: str,
    columns: Mapping[str, Column] | None = None,
    *,
    root: str = "filter",
    prefix: str = "f",
) -> Sql:
    """The SQL condition (over the JSONB expression ``doc``) that a row matches the filter
    ``document`` by; ``columns``: top-level fields kept in columns of their own."""
    try:
        check_depth(document, root)
    except TooDeep as error:
        raise MongoError(error.field, error.message) from None
    compiler = _Filter(doc, columns or {}, _Binds(prefix))
    text = compiler.document(document, root)
    return Sql(text, compiler.binds.params)


def _literal(value: Any, location: str) -> str:
    """A scalar as a SQL/JSON path literal."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MongoError(location, "a number must be finite")
        return repr(value)
    if isinstance(value, str):
        return _json(value)
    raise MongoError(location, "expected a scalar")


def _jsonpath(segments: Sequence[str]) -> str:
    return "$" + "".join("." + _json(segment) for segment in segments)


def _nest(segments: Sequence[str], value: Any) -> Any:
    for segment in reversed(segments):
        value = {segment: value}
    return value


@dataclass
class _Filter:
    doc: str
    columns: Mapping[str, Column]
    binds: _Binds
    #: Comparisons and logical operators read so far (:data:`MAX_TERMS`).
    terms: int = 0

    def count(self, terms: int, where: str) -> None:
        self.terms += terms
        if self.terms > MAX_TERMS:
            raise MongoError(where, f"a filter holds at most {MAX_TERMS} conditions")

    def document(self, document: Any, location: str) -> str:
        if not isinstance(document, dict):
            raise MongoError(location, "a filter is a JSON object")
        clauses = []
        for key, value in document.items():
            where = f"{location}.{key}"
            self.count(1, where)
            if key in LOGICAL:
                clauses.append(self.logical(key, value, where))
            elif key.startswith("$"):
                raise MongoError(where, f"unknown operator {key}")
            else:
                clauses.append(self.field(key, value, where))
        return "(" + " AND ".join(clauses) + ")" if clauses else "TRUE"

    def logical(self, operator: str, value: Any, location: str) -> str:
        if not isinstance(value, list) or not value:
            raise MongoError(location, f"{operator} takes a non-empty list of filters")
        parts = [self.document(item, f"{location}[{i}]") for i, item in enumerate(value)]
        if operator == "$and":
            return "(" + " AND ".join(parts) + ")"
        joined = "(" + " OR ".join(parts) + ")"
        return joined if operator == "$or" else f"(NOT {joined})"

    def field(self, path: str, condition: Any, location: str) -> str:
        segments = _split(path, location)
        operators = isinstance(condition, dict) and any(k.startswith("$") for k in condition)
        if not operators:
            return self.equal(segments, condition, location)
        assert isinstance(condition, dict)
        clauses = []
        if "$options" in condition and "$regex" not in condition:
            raise MongoError(f"{location}.$options", "$options goes with $regex")
        for operator, value in condition.items():
            where = f"{location}.{operator}"
            if operator == "$options":
                continue
            if operator == "$regex":
                clauses.append(self.regex(segments, value, condition.get("$options", ""), where))
                continue
            if operator not in FILTER_OPERATORS:
                if operator.startswith("$"):
                    raise MongoError(where, f"unknown operator {operator}")
                raise MongoError(where, "operators and fields cannot be mixed in a condition")
            clauses.append(self.operator(segments, operator, value, where))
        return "(" + " AND ".join(clauses) + ")"

    def operator(self, segments: tuple[str, ...], operator: str, value: Any, where: str) -> str:
        if operator == "$eq":
            return self.equal(segments, value, where)
        if operator == "$ne":
            return f"(NOT {self.equal(segments, value, where)})"
        if operator in ("$in", "$nin"):
            if not isinstance(value, list):
                raise MongoError(where, f"{operator} takes a list")
            if len(value) > MAX_LIST:
                raise MongoError(where, f"{operator} takes at most {MAX_LIST} values")
            self.count(len(value), where)
            found = self.any_of(segments, value, where)
            return found if operator == "$in" else f"(NOT {found})"
        if operator == "$exists":
            if not isinstance(value, bool):
                raise MongoError(where, "$exists takes true or false")
            exists = self.exists(segments)
            return exists if value else f"(NOT {exists})"
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise MongoError(where, f"{operator} compares with a number or a string")
        return self.compare(segments, COMPARISONS[operator], value, where)

    # Each of these answers one comparison, for a column or for the document.

    def column(self, segments: tuple[str, ...]) -> Column | None:
        return self.columns.get(segments[0]) if len(segments) == 1 else None

    def parsed(self, column: Column, value: Any, where: str) -> str:
        try:
            return self.binds(column.parse(value))
        except (TypeError, ValueError) as error:
            raise MongoError(where, f"not a value of this field: {error}") from None

    def exists(self, segments: tuple[str, ...]) -> str:
        column = self.column(segments)
        if column is not None:
            return f"({column.sql} IS NOT NULL)"
        return f"({self.doc} @? {self.binds.jsonpath(_jsonpath(segments))})"

    def compare(self, segments: tuple[str, ...], op: str, value: Any, where: str) -> str:
        column = self.column(segments)
        if column is not None:
            return f"({column.sql} {op} {self.parsed(column, value, where)})"
        predicate = f"{_jsonpath(segments)} ? (@ {op} {_literal(value, where)})"
        return f"({self.doc} @? {self.binds.jsonpath(predicate)})"

    def regex(self, segments: tuple[str, ...], pattern: Any, options: Any, where: str) -> str:
        if not isinstance(pattern, str):
            raise MongoError(where, "$regex takes a string")
        if not isinstance(options, str) or not set(options) <= REGEX_FLAGS:
            raise MongoError(where.removesuffix("$regex") + "$options", "flags are i, m, s, x")
        try:
            re.compile(pattern)
        except re.error as error:
            raise MongoError(where, f"not a regular expression ({error})") from None
        if self.column(segments) is not None:
            raise MongoError(where, "$regex applies to the document's fields")
        flags = f" flag {_json(options)}" if options else ""
        predicate = f"{_jsonpath(segments)} ? (@ like_regex {_json(pattern)}{flags})"
        return f"({self.doc} @? {self.binds.jsonpath(predicate)})"

    def equal(self, segments: tuple[str, ...], value: Any, where: str) -> str:
        return self.any_of(segments, [value], where)

    def any_of(self, segments: tuple[str, ...], values: list[Any], where: str) -> str:
        """The field equals one of ``values`` (a list field: holds one of them)."""
        if not values:
            return "FALSE"
        column = self.column(segments)
        if column is not None:
            clauses = [
                f"({column.sql} IS NULL)"
                if value is None
                else f"({column.sql} = {self.parsed(column, value, where)})"
                for value in values
            ]
            return "(" + " OR ".join(clauses) + ")"
        clauses = []
        scalars = [value for value in values if _is_scalar(value)]
        if scalars:
            tests = " || ".join(f"@ == {_literal(value, where)}" for value in scalars)
            predicate = f"{_jsonpath(segments)} ? ({tests})"
            clauses.append(f"({self.doc} @? {self.binds.jsonpath(predicate)})")
            if None in scalars:
                clauses.append(f"(NOT {self.exists(segments)})")
        for value in values:
            if not _is_scalar(value):
                clauses.append(self.equal_document(segments, value))
        return "(" + " OR ".join(clauses) + ")"

    def equal_document(self, segments: tuple[str, ...], value: Any) -> str:
        """Equality with a document or a list: the value at the path, or an element of the list
        there. Containment (indexed) first, where the path names no list index."""
        at = f"({self.doc} #> {self.binds.path(segments)})"
        exact = f"({at} = {self.binds.jsonb(value)})"
        element = (
            f"EXISTS (SELECT 1 FROM jsonb_array_elements(CASE WHEN jsonb_typeof({at}) = 'array'"
            f" THEN {at} END) AS e(v) WHERE e.v = {self.binds.jsonb(value)})"
        )
        if not any(_INDEX.fullmatch(segment) for segment in segments):
            exact = f"({self.doc} @> {self.binds.jsonb(_nest(segments, value))} AND {exact})"
            contains = self.binds.jsonb(_nest(segments, [value]))
            element = f"({self.doc} @> {contains} AND {element})"
        return f"({exact} OR {element})"


# -- updates ----------------------------------------------------------------------------------
