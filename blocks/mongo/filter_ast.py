"""A filter document read into a small tree of conditions (:data:`Filter`), every check made.

:func:`parse_filter` refuses what cannot be translated with :class:`MongoError`, naming where
it is, in the order the document is read; what it returns always compiles
(:mod:`blocks.mongo.filter_sql`). Fields kept in columns of their own are resolved here: their
values arrive already parsed by their :class:`Column`. A value compared in the document is
checked to be one JSON can hold (a finite number), so that compiling never fails.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from blocks.mongo.common import Column, MongoError, split_path, to_json
from core.nesting import TooDeep, check_depth

__all__ = [
    "COMPARISONS",
    "FILTER_OPERATORS",
    "And",
    "ColumnCompare",
    "ColumnNull",
    "Compare",
    "EqualsDocument",
    "EqualsScalar",
    "Exists",
    "Filter",
    "Not",
    "Or",
    "Regex",
    "parse_condition",
    "parse_filter",
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

Path = tuple[str, ...]
Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class And:
    """Every part holds (none: always true)."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Or:
    """Some part holds (none: never true)."""

    parts: tuple[Filter, ...]


@dataclass(frozen=True)
class Not:
    """The part does not hold."""

    part: Filter


@dataclass(frozen=True)
class Exists:
    """The document has a value at ``path``."""

    path: Path


@dataclass(frozen=True)
class Compare:
    """The value at ``path`` (or an element of the list there) compares so with ``value``;
    ``op`` is SQL's (``>``, ``>=``, ``<``, ``<=``)."""

    path: Path
    op: str
    value: str | int | float


@dataclass(frozen=True)
class Regex:
    """The string at ``path`` (or an element of the list there) matches ``pattern``."""

    path: Path
    pattern: str
    options: str


@dataclass(frozen=True)
class EqualsScalar:
    """The value at ``path`` (or an element of the list there) equals one of ``values``."""

    path: Path
    values: tuple[Scalar, ...]


@dataclass(frozen=True)
class EqualsDocument:
    """The value at ``path``, or an element of the list there, equals ``value``, a document or
    a list."""

    path: Path
    value: Any


@dataclass(frozen=True)
class ColumnNull:
    """The column is NULL (``null``), or is not."""

    column: Column
    null: bool


@dataclass(frozen=True)
class ColumnCompare:
    """The column compares so (SQL's ``op``, ``=`` among them) with ``value``, already the
    column's."""

    column: Column
    op: str
    value: Any


#: A condition on a value of the document.
PathCondition = Exists | Compare | Regex | EqualsScalar | EqualsDocument
#: One condition of a filter.
Filter = And | Or | Not | PathCondition | ColumnNull | ColumnCompare


def parse_filter(document: Any, columns: Mapping[str, Column], root: str = "filter") -> Filter:
    """The conditions of the filter ``document``; ``columns``: top-level fields kept in
    columns of their own."""
    try:
        check_depth(document, root)
    except TooDeep as error:
        raise MongoError(error.field, error.message) from None
    return _Parser(columns).document(document, root)


def parse_condition(condition: Mapping[str, Any], location: str) -> Filter:
    """The conditions an object of comparison operators (``{"$gt": 1, "$ne": 5}``) sets on a
    value itself (a list's element, for ``$pull``)."""
    parser = _Parser({})
    parts = [
        parser.operator((), key, value, f"{location}.{key}") for key, value in condition.items()
    ]
    return And(tuple(parts))


def _is_scalar(value: Any) -> TypeGuard[Scalar]:
    return value is None or isinstance(value, str | int | float | bool)


def _finite(value: Scalar, location: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise MongoError(location, "a number must be finite")


@dataclass
class _Parser:
    columns: Mapping[str, Column]
    #: Comparisons and logical operators read so far (:data:`MAX_TERMS`).
    terms: int = 0

    def count(self, terms: int, where: str) -> None:
        self.terms += terms
        if self.terms > MAX_TERMS:
            raise MongoError(where, f"a filter holds at most {MAX_TERMS} conditions")

    def document(self, document: Any, location: str) -> Filter:
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
        return And(tuple(clauses))

    def logical(self, operator: str, value: Any, location: str) -> Filter:
        if not isinstance(value, list) or not value:
            raise MongoError(location, f"{operator} takes a non-empty list of filters")
        parts = tuple(self.document(item, f"{location}[{i}]") for i, item in enumerate(value))
        if operator == "$and":
            return And(parts)
        return Or(parts) if operator == "$or" else Not(Or(parts))

    def field(self, path: str, condition: Any, location: str) -> Filter:
        segments = split_path(path, location)
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
        return And(tuple(clauses))

    def operator(self, segments: Path, operator: str, value: Any, where: str) -> Filter:
        if operator == "$eq":
            return self.equal(segments, value, where)
        if operator == "$ne":
            return Not(self.equal(segments, value, where))
        if operator in ("$in", "$nin"):
            if not isinstance(value, list):
                raise MongoError(where, f"{operator} takes a list")
            if len(value) > MAX_LIST:
                raise MongoError(where, f"{operator} takes at most {MAX_LIST} values")
            self.count(len(value), where)
            found = self.any_of(segments, value, where)
            return found if operator == "$in" else Not(found)
        if operator == "$exists":
            if not isinstance(value, bool):
                raise MongoError(where, "$exists takes true or false")
            exists = self.exists(segments)
            return exists if value else Not(exists)
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise MongoError(where, f"{operator} compares with a number or a string")
        return self.compare(segments, COMPARISONS[operator], value, where)

    # Each of these reads one comparison, for a column or for the document.

    def column(self, segments: Path) -> Column | None:
        return self.columns.get(segments[0]) if len(segments) == 1 else None

    def parsed(self, column: Column, value: Any, where: str) -> Any:
        try:
            return column.parse(value)
        except (TypeError, ValueError) as error:
            raise MongoError(where, f"not a value of this field: {error}") from None

    def exists(self, segments: Path) -> Filter:
        column = self.column(segments)
        return Exists(segments) if column is None else ColumnNull(column, null=False)

    def compare(self, segments: Path, op: str, value: str | int | float, where: str) -> Filter:
        column = self.column(segments)
        if column is not None:
            return ColumnCompare(column, op, self.parsed(column, value, where))
        _finite(value, where)
        return Compare(segments, op, value)

    def regex(self, segments: Path, pattern: Any, options: Any, where: str) -> Filter:
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
        return Regex(segments, pattern, options)

    def equal(self, segments: Path, value: Any, where: str) -> Filter:
        return self.any_of(segments, [value], where)

    def any_of(self, segments: Path, values: list[Any], where: str) -> Filter:
        """The field equals one of ``values`` (a list field: holds one of them)."""
        if not values:
            return Or(())
        column = self.column(segments)
        if column is not None:
            return Or(
                tuple(
                    ColumnNull(column, null=True)
                    if value is None
                    else ColumnCompare(column, "=", self.parsed(column, value, where))
                    for value in values
                )
            )
        clauses: list[Filter] = []
        scalars = tuple(value for value in values if _is_scalar(value))
        for scalar in scalars:
            _finite(scalar, where)
        if scalars:
            clauses.append(EqualsScalar(segments, scalars))
            if None in scalars:
                clauses.append(Not(Exists(segments)))
        for value in values:
            if not _is_scalar(value):
                to_json(value)  # raises here, in reading order, for what JSON cannot hold
                clauses.append(EqualsDocument(segments, value))
        return Or(tuple(clauses))
