"""MongoDB-style filters and update documents, translated to SQL over a JSONB column.

Nothing here touches a database or loads a row: each function reads a document and returns SQL
text with its bind parameters (:class:`Sql`), which Postgres evaluates. A document this module
cannot translate (an unknown operator, a value of the wrong kind, two updates of one path) is
refused with :class:`MongoError`, which names where it is (``filter.a.$foo``); nothing is
ignored.

Filters (:func:`compile_filter`): dotted-path equality, ``$eq``, ``$ne``, ``$in``, ``$nin``,
``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$exists``, ``$and``, ``$or``, ``$nor``. A comparison
with a scalar is a SQL/JSON path predicate, ``doc @? '$."a"."b" ? (@ == "x")'``: in the lax mode
a member accessor steps into arrays and a filter tests each element, which is MongoDB's own
reading (``{"tags": "NLP"}`` matches a list holding "NLP"; ``a.b`` reaches into a list of
documents), and the operator is one the GIN ``jsonb_path_ops`` index serves. Equality with a
document or a list is containment (``doc @> {"a": {"b": v}}``, indexed) confirmed by exact
equality at the path, or an element of a list at the path equal to it. ``null`` matches a
missing field too, as in MongoDB. Some fields may live in their own columns
(:class:`Column`), compared there.

Updates (:func:`parse_update`, then :func:`update_select`): ``$set`` (dotted paths, creating
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

__all__ = [
    "COMPARISONS",
    "FILTER_OPERATORS",
    "UPDATE_OPERATORS",
    "Change",
    "Column",
    "MongoError",
    "Sql",
    "compile_filter",
    "parse_update",
    "update_select",
]

COMPARISONS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}
FILTER_OPERATORS = frozenset({"$eq", "$ne", "$in", "$nin", "$exists", *COMPARISONS})
LOGICAL = frozenset({"$and", "$or", "$nor"})
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

    def document(self, document: Any, location: str) -> str:
        if not isinstance(document, dict):
            raise MongoError(location, "a filter is a JSON object")
        clauses = []
        for key, value in document.items():
            where = f"{location}.{key}"
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
        for operator, value in condition.items():
            where = f"{location}.{operator}"
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


@dataclass(frozen=True)
class Change:
    """One operator applied to one path. ``value``: for ``$push`` and ``$addToSet`` the list
    of items (``$each`` or one); for ``$pull`` the value or condition; for ``$unset`` None."""

    operator: str
    path: tuple[str, ...]
    value: Any
    location: str


def parse_update(document: Any, root: str = "update") -> list[Change]:
    """The changes an update document names, checked; :class:`MongoError` for any fault."""
    if not isinstance(document, dict) or not document:
        raise MongoError(root, "an update is a JSON object of update operators")
    changes: list[Change] = []
    for operator, fields in document.items():
        where = f"{root}.{operator}"
        if operator not in UPDATE_OPERATORS:
            if operator.startswith("$"):
                raise MongoError(where, f"unknown update operator {operator}")
            raise MongoError(
                where, "not an update operator: replacing the record is not supported; use $set"
            )
        if not isinstance(fields, dict) or not fields:
            raise MongoError(where, f"{operator} takes a non-empty object of paths")
        for path, value in fields.items():
            location = f"{where}.{path}"
            segments = _split(path, location)
            changes.append(
                Change(operator, segments, _operand(operator, value, location), location)
            )
    _refuse_conflicts(changes)
    return changes


def _operand(operator: str, value: Any, location: str) -> Any:
    if operator == "$unset":
        return None
    if operator == "$inc":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MongoError(location, "$inc takes a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise MongoError(location, "a number must be finite")
        return value
    if operator in ("$push", "$addToSet"):
        return _items(value, location)
    if operator == "$pull" and _is_condition(value):
        for key, operand in value.items():
            where = f"{location}.{key}"
            if key not in FILTER_OPERATORS - {"$exists"}:
                raise MongoError(where, f"unknown operator {key}")
            if key in ("$in", "$nin") and not isinstance(operand, list):
                raise MongoError(where, f"{key} takes a list")
    return value


def _is_condition(value: Any) -> bool:
    return isinstance(value, dict) and any(key.startswith("$") for key in value)


def _items(value: Any, location: str) -> list[Any]:
    """What ``$push`` or ``$addToSet`` adds: ``$each``'s list, or the one value."""
    if not _is_condition(value):
        return [value]
    unknown = [key for key in value if key != "$each"]
    if unknown:
        raise MongoError(f"{location}.{unknown[0]}", f"unknown modifier {unknown[0]}")
    if not isinstance(value["$each"], list):
        raise MongoError(f"{location}.$each", "$each takes a list")
    return list(value["$each"])


def _refuse_conflicts(changes: list[Change]) -> None:
    for i, later in enumerate(changes):
        for earlier in changes[:i]:
            shorter = min(len(later.path), len(earlier.path))
            if later.path[:shorter] == earlier.path[:shorter]:
                raise MongoError(
                    later.location,
                    f"updating {'.'.join(later.path)} conflicts with {earlier.location}",
                )


@dataclass
class _Step:
    """One expression of the previous document ``{d}``; NULL when it cannot apply."""

    expression: str
    location: str


def update_select(changes: Sequence[Change], source: str, *, prefix: str = "u") -> Sql:
    """``SELECT doc, failed``: the document ``source`` (a SQL expression, which may name a
    column of an outer query) with the changes applied, and the 1-based number of the first
    step that could not apply (NULL when all did), whose operator ``locations[failed]`` names."""
    binds = _Binds(prefix)
    steps = [step for change in changes for step in _steps(change, binds)]
    laterals = [f"(SELECT {source} AS d) AS s0"]
    for n, step in enumerate(steps, 1):
        expression = step.expression.replace("{d}", f"s{n - 1}.d")
        laterals.append(f"CROSS JOIN LATERAL (SELECT {expression} AS d) AS s{n}")
    failed = " ".join(f"WHEN s{n}.d IS NULL THEN {n}" for n in range(len(steps) + 1))
    text = f"SELECT s{len(steps)}.d AS doc, CASE {failed} END AS failed FROM " + " ".join(laterals)
    locations = [changes[0].location if changes else "update"] + [s.location for s in steps]
    return Sql(text, binds.params, locations)


def _steps(change: Change, binds: _Binds) -> list[_Step]:
    path, where = change.path, change.location
    at = f"({{d}} #> {binds.path(path)})"
    parent = f"jsonb_typeof({{d}} #> {binds.path(path[:-1])})"
    # A missing field may be created where its parent is a document.
    creatable = f"({at} IS NULL AND {parent} = 'object')"
    target = binds.path(path)
    operator = change.operator
    if operator == "$unset":
        nulled = f"(CASE WHEN {at} IS NULL THEN {{d}} ELSE jsonb_set({{d}}, {target}, 'null') END)"
        expression = f"(CASE WHEN {parent} = 'array' THEN {nulled} ELSE {{d}} #- {target} END)"
        return [_Step(expression, where)]
    steps = _parents(path, where, binds)
    if operator == "$set":
        settable = f"{parent} = 'object'"
        if _INDEX.fullmatch(path[-1]):
            settable += f" OR {parent} = 'array'"
        value = binds.jsonb(change.value)
        steps.append(
            _Step(f"(CASE WHEN {settable} THEN jsonb_set({{d}}, {target}, {value}) END)", where)
        )
    elif operator == "$inc":
        amount = f"CAST({binds(str(change.value))} AS numeric)"
        added = f"to_jsonb(CAST({{d}} #>> {target} AS numeric) + {amount})"
        steps.append(
            _Step(
                f"(CASE WHEN {creatable} THEN jsonb_set({{d}}, {target}, to_jsonb({amount}))"
                f" WHEN jsonb_typeof({at}) = 'number' THEN jsonb_set({{d}}, {target}, {added})"
                " END)",
                where,
            )
        )
    elif operator in ("$push", "$addToSet"):
        items: list[Any] = change.value
        pushed = items if operator == "$push" else []
        steps.append(_Step(_append(at, creatable, target, binds.jsonb(pushed)), where))
        for item in items if operator == "$addToSet" else []:
            value = binds.jsonb(item)
            present = (
                f"EXISTS (SELECT 1 FROM jsonb_array_elements({at}) AS e(v) WHERE e.v = {value})"
            )
            appended = f"jsonb_set({{d}}, {target}, {at} || jsonb_build_array({value}))"
            steps.append(_Step(f"(CASE WHEN {present} THEN {{d}} ELSE {appended} END)", where))
    else:  # $pull: a missing field is left as it is
        matches = _element_matches("x.v", change.value, where, binds)
        kept = (
            f"COALESCE((SELECT jsonb_agg(x.v ORDER BY x.i) FROM jsonb_array_elements({at})"
            f" WITH ORDINALITY AS x(v, i) WHERE NOT {matches}), '[]')"
        )
        steps = [
            _Step(
                f"(CASE WHEN {at} IS NULL THEN {{d}} WHEN jsonb_typeof({at}) = 'array'"
                f" THEN jsonb_set({{d}}, {target}, {kept}) END)",
                where,
            )
        ]
    return steps


def _append(at: str, creatable: str, target: str, items: str) -> str:
    return (
        f"(CASE WHEN {creatable} THEN jsonb_set({{d}}, {target}, {items})"
        f" WHEN jsonb_typeof({at}) = 'array' THEN jsonb_set({{d}}, {target}, {at} || {items}) END)"
    )


def _parents(path: tuple[str, ...], where: str, binds: _Binds) -> list[_Step]:
    """Steps that make each document on the way to ``path`` exist: a missing one is created
    (in a document), one that is a document or a list is kept, anything else fails."""
    steps = []
    for k in range(1, len(path)):
        prefix = binds.path(path[:k])
        at = f"({{d}} #> {prefix})"
        parent = f"jsonb_typeof({{d}} #> {binds.path(path[: k - 1])})"
        steps.append(
            _Step(
                f"(CASE WHEN jsonb_typeof({at}) IN ('object', 'array') THEN {{d}}"
                f" WHEN {at} IS NULL AND {parent} = 'object'"
                f" THEN jsonb_set({{d}}, {prefix}, '{{}}') END)",
                where,
            )
        )
    return steps


def _element_matches(element: str, condition: Any, where: str, binds: _Binds) -> str:
    """Whether a list's element matches ``$pull``'s value or condition."""
    if isinstance(condition, dict) and any(k.startswith("$") for k in condition):
        compiler = _Filter(element, {}, binds)
        clauses = [
            compiler.operator((), key, value, f"{where}.{key}") for key, value in condition.items()
        ]
        return "(" + " AND ".join(clauses) + ")"
    value = binds.jsonb(condition)
    if isinstance(condition, dict):  # a document matches the elements holding its fields
        return f"(jsonb_typeof({element}) = 'object' AND {element} @> {value})"
    return f"({element} = {value})"
