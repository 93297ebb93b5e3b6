"""MongoDB-style filters, translated to SQL over a JSONB column: the entry, :func:`compile_filter`.

Nothing here touches a database or loads a row: a filter document is read into a small tree of
conditions (:mod:`blocks.mongo.filter_ast`) and compiled to SQL text with its bind parameters
(:mod:`blocks.mongo.filter_sql`), which Postgres evaluates. A document that cannot be
translated (an unknown operator, a value of the wrong kind) is refused with
:class:`~blocks.mongo.common.MongoError`, which names where it is (``filter.a.$foo``); nothing
is ignored.

The language: dotted-path equality, ``$eq``, ``$ne``, ``$in``, ``$nin``, ``$gt``, ``$gte``,
``$lt``, ``$lte``, ``$exists``, ``$regex`` (with ``$options`` ``i``, ``m``, ``s``, ``x``: a
SQL/JSON ``like_regex``, POSIX regular expressions), ``$and``, ``$or``, ``$nor``; at most
:data:`~blocks.mongo.filter_ast.MAX_LIST` values in one ``$in`` and
:data:`~blocks.mongo.filter_ast.MAX_TERMS` conditions in all, nested at most
``core.nesting.MAX_DEPTH`` deep. A comparison with a scalar is a SQL/JSON path predicate,
``doc @? '$."a"."b" ? (@ == "x")'``: in the lax mode a member accessor steps into arrays and a
filter tests each element, which is MongoDB's own reading (``{"tags": "NLP"}`` matches a list
holding "NLP"; ``a.b`` reaches into a list of documents), and the operator is one the GIN
``jsonb_path_ops`` index serves. Equality with a document or a list is containment
(``doc @> {"a": {"b": v}}``, indexed) confirmed by exact equality at the path, or an element of
a list at the path equal to it. ``null`` matches a missing field too, as in MongoDB. Some
fields may live in their own columns (:class:`~blocks.mongo.common.Column`), compared there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blocks.mongo.common import Binds, Column, Sql
from blocks.mongo.filter_ast import parse_filter
from blocks.mongo.filter_sql import compile_condition

__all__ = ["compile_filter"]


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
    node = parse_filter(document, columns or {}, root)
    binds = Binds(prefix)
    return Sql(compile_condition(node, doc, binds), binds.params)
