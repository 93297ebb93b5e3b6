"""MongoDB update documents for the registry: parsed and checked (:func:`parse_update`), then
compiled to one SQL expression over the stored JSONB document (:func:`update_select`).

The operators: ``$set`` (dotted paths, creating missing documents on the way), ``$unset``,
``$inc``, ``$push`` and ``$addToSet`` (a value or ``{"$each": [...]}``), ``$pull`` (a value, or
a condition of the filters' comparison operators, :mod:`blocks.mongo.filter_ast`). Each
operator is one step of a chain of ``CROSS JOIN LATERAL`` subqueries, each a ``jsonb_set`` /
``#-`` / ``||`` expression over the previous step's document, so that the whole update is one
expression of the row evaluated in one statement (the caller's ``UPDATE`` locks the row). A
step that meets a value it cannot apply to (``$inc`` of a string, ``$push`` to a non-list, a
path through a string) yields NULL; the select reports the first such step, whose location the
caller answers with, and stores nothing. A document that cannot be translated (an unknown
operator, a value of the wrong kind, two updates of one path) is refused with
:class:`~blocks.mongo.common.MongoError`, naming where it is. Differences from MongoDB: an index
past the end of a list in ``$set`` appends rather than pads with nulls; positional paths
(``a.$``, ``a.$[]``) and the other update operators are refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blocks.mongo.common import INDEX, Binds, MongoError, Sql, split_path
from blocks.mongo.filter_ast import FILTER_OPERATORS, parse_condition
from blocks.mongo.filter_sql import compile_condition
from core.nesting import TooDeep, check_depth

UPDATE_OPERATORS = frozenset({"$set", "$unset", "$inc", "$push", "$addToSet", "$pull"})


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
    try:
        check_depth(document, root)
    except TooDeep as error:
        raise MongoError(error.field, error.message) from None
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
            segments = split_path(path, location)
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
            if key not in FILTER_OPERATORS - {"$exists", "$regex", "$options"}:
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
    binds = Binds(prefix)
    steps = [step for change in changes for step in _steps(change, binds)]
    laterals = [f"(SELECT {source} AS d) AS s0"]
    for n, step in enumerate(steps, 1):
        expression = step.expression.replace("{d}", f"s{n - 1}.d")
        laterals.append(f"CROSS JOIN LATERAL (SELECT {expression} AS d) AS s{n}")
    failed = " ".join(f"WHEN s{n}.d IS NULL THEN {n}" for n in range(len(steps) + 1))
    text = f"SELECT s{len(steps)}.d AS doc, CASE {failed} END AS failed FROM " + " ".join(laterals)
    locations = [changes[0].location if changes else "update"] + [s.location for s in steps]
    return Sql(text, binds.params, locations)


def _steps(change: Change, binds: Binds) -> list[_Step]:
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
        if INDEX.fullmatch(path[-1]):
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


def _parents(path: tuple[str, ...], where: str, binds: Binds) -> list[_Step]:
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


def _element_matches(element: str, condition: Any, where: str, binds: Binds) -> str:
    """Whether a list's element matches ``$pull``'s value or condition."""
    if isinstance(condition, dict) and any(k.startswith("$") for k in condition):
        return compile_condition(parse_condition(condition, where), element, binds)
    value = binds.jsonb(condition)
    if isinstance(condition, dict):  # a document matches the elements holding its fields
        return f"(jsonb_typeof({element}) = 'object' AND {element} @> {value})"
    return f"({element} = {value})"
