"""MongoDB filters and updates as SQL (``blocks.mongo.filters``), executed by a real Postgres: each
filter against rows of a temporary table, each update against a document, and every refusal
naming where it is."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from blocks.mongo.common import MongoError
from blocks.mongo.filters import compile_filter
from blocks.mongo.updates import parse_update, update_select

ROWS: dict[str, dict[str, Any]] = {
    "east": {
        "name": "east",
        "meta": {"region": "us-east-1", "zone": "us-east-1a", "gpu": True, "rps": 100},
        "tags": ["NLP", "BERT"],
        "nodes": [{"kind": "a100", "count": 2}, {"kind": "h100", "count": 1}],
    },
    "west": {
        "name": "west",
        "meta": {"region": "us-west-2", "zone": "us-west-2b", "gpu": False, "rps": 10},
        "tags": ["LLM"],
        "nodes": [{"kind": "t4", "count": 8}],
    },
    "bare": {"name": "bare", "meta": {"region": None, "shape": {"x": 1}}, "tags": [["a", "b"]]},
}


@pytest.fixture
async def conn(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    async with engine.connect() as connection:
        await connection.execute(text("CREATE TEMP TABLE docs (id text PRIMARY KEY, doc jsonb)"))
        for key, doc in ROWS.items():
            await connection.execute(
                text("INSERT INTO docs VALUES (:id, CAST(:doc AS jsonb))"),
                {"id": key, "doc": json.dumps(doc)},
            )
        yield connection
        await connection.rollback()


async def matching(conn: AsyncConnection, document: Any) -> set[str]:
    sql = compile_filter(document, "doc")
    rows = await conn.execute(text(f"SELECT id FROM docs WHERE {sql.text}"), sql.params)
    return {row.id for row in rows}


FILTERS: list[tuple[Any, set[str]]] = [
    ({}, {"east", "west", "bare"}),
    ({"meta.zone": "us-east-1a", "meta.gpu": True}, {"east"}),
    ({"meta.region": "us-west-2"}, {"west"}),
    ({"tags": "NLP"}, {"east"}),  # a list holding it
    ({"tags": {"$in": ["NLP", "LLM"]}}, {"east", "west"}),
    ({"tags": {"$nin": ["NLP", "LLM"]}}, {"bare"}),
    ({"meta.rps": {"$gt": 10}}, {"east"}),
    ({"meta.rps": {"$gte": 10}}, {"east", "west"}),
    ({"meta.rps": {"$lt": 100}}, {"west"}),
    ({"meta.rps": {"$lte": 100, "$gt": 10}}, {"east"}),
    ({"meta.zone": {"$gte": "us-west"}}, {"west"}),
    ({"meta.region": {"$ne": "us-east-1"}}, {"west", "bare"}),
    ({"meta.region": {"$eq": "us-east-1"}}, {"east"}),
    ({"meta.gpu": {"$exists": True}}, {"east", "west"}),
    ({"meta.gpu": {"$exists": False}}, {"bare"}),
    ({"meta.region": None}, {"bare"}),  # null, or missing
    ({"meta.gpu": None}, {"bare"}),
    ({"nodes.kind": "h100"}, {"east"}),  # into a list of documents
    ({"nodes.count": {"$gte": 8}}, {"west"}),
    ({"meta.shape": {"x": 1}}, {"bare"}),  # a document: exact equality
    ({"meta.shape": {}}, set()),
    ({"tags": ["LLM"]}, {"west"}),  # a list: exact equality
    ({"tags": ["a", "b"]}, {"bare"}),  # or an element equal to it
    ({"tags": ["BERT", "NLP"]}, set()),
    ({"$or": [{"name": "east"}, {"meta.rps": 10}]}, {"east", "west"}),
    ({"$and": [{"meta.gpu": {"$exists": True}}, {"tags": {"$ne": "LLM"}}]}, {"east"}),
    ({"$nor": [{"name": "east"}, {"name": "west"}]}, {"bare"}),
    ({"meta.zone": {"$regex": "^us-.*-1a$"}}, {"east"}),
    ({"meta.region": {"$regex": "US-", "$options": "i"}}, {"east", "west"}),
    ({"tags": {"$regex": "^L"}}, {"west"}),  # an element of a list
    ({"meta.zone": {"$regex": 'a"b\\.'}}, set()),  # quoting in the pattern
    ({"name": 'we"st'}, set()),  # quoting in paths' literals
    ({'odd"key': 1}, set()),
]


@pytest.mark.parametrize(("document", "expected"), FILTERS, ids=[str(f[0]) for f in FILTERS])
async def test_filters(conn: AsyncConnection, document: Any, expected: set[str]) -> None:
    assert await matching(conn, document) == expected


REFUSED_FILTERS: list[tuple[Any, str]] = [
    ({"meta": {"$foo": 1}}, "filter.meta.$foo"),
    ({"$where": "x"}, "filter.$where"),
    ({"meta.rps": {"$gt": 1, "x": 2}}, "filter.meta.rps.x"),
    ({"tags": {"$in": "NLP"}}, "filter.tags.$in"),
    ({"meta.rps": {"$gt": [1]}}, "filter.meta.rps.$gt"),
    ({"meta.rps": {"$gt": True}}, "filter.meta.rps.$gt"),
    ({"meta.gpu": {"$exists": 1}}, "filter.meta.gpu.$exists"),
    ({"$or": []}, "filter.$or"),
    ({"$and": [{"a": 1}, 3]}, "filter.$and[1]"),
    ({"$or": [{"a": {"$regex": 1}}]}, "filter.$or[0].a.$regex"),
    ({"a": {"$regex": "("}}, "filter.a.$regex"),
    ({"a": {"$regex": "x", "$options": "g"}}, "filter.a.$options"),
    ({"a": {"$options": "i"}}, "filter.a.$options"),
    ({"a..b": 1}, "filter.a..b"),
    ({"tags.$": 1}, "filter.tags.$"),
    ([1], "filter"),
]


@pytest.mark.parametrize(("document", "location"), REFUSED_FILTERS)
def test_refused_filters(document: Any, location: str) -> None:
    with pytest.raises(MongoError) as refused:
        compile_filter(document, "doc")
    assert refused.value.location == location


async def updated(conn: AsyncConnection, doc: Any, update: Any) -> tuple[Any, str | None]:
    """The document after the update, and where it failed (None: it applied)."""
    sql = update_select(parse_update(update), "CAST(:doc AS jsonb)")
    row = (await conn.execute(text(sql.text), {**sql.params, "doc": json.dumps(doc)})).one()
    return row.doc, (sql.locations[row.failed] if row.failed is not None else None)


BASE: dict[str, Any] = {"name": "east", "meta": {"region": "us-east-1", "rps": 1}, "tags": ["NLP"]}
UPDATES: list[tuple[Any, Any]] = [
    (
        {"$set": {"meta.region": "us-west-2", "meta.provider": "Google Cloud"}},
        {**BASE, "meta": {"region": "us-west-2", "rps": 1, "provider": "Google Cloud"}},
    ),
    ({"$set": {"meta.a.b.c": [1]}}, {**BASE, "meta": {**BASE["meta"], "a": {"b": {"c": [1]}}}}),
    ({"$set": {"tags.0": "LLM"}}, {**BASE, "tags": ["LLM"]}),
    ({"$push": {"tags": "LLM"}}, {**BASE, "tags": ["NLP", "LLM"]}),
    ({"$push": {"tags": {"$each": ["a", "b"]}}}, {**BASE, "tags": ["NLP", "a", "b"]}),
    ({"$push": {"meta.list": ["x"]}}, {**BASE, "meta": {**BASE["meta"], "list": [["x"]]}}),
    ({"$addToSet": {"tags": "NLP"}}, BASE),
    ({"$addToSet": {"tags": {"$each": ["NLP", "X", "X"]}}}, {**BASE, "tags": ["NLP", "X"]}),
    ({"$addToSet": {"meta.new": {"$each": []}}}, {**BASE, "meta": {**BASE["meta"], "new": []}}),
    ({"$pull": {"tags": "NLP"}}, {**BASE, "tags": []}),
    ({"$pull": {"tags": {"$in": ["NLP", "Q"]}}}, {**BASE, "tags": []}),
    ({"$pull": {"meta.missing": 1}}, BASE),
    ({"$unset": {"meta.region": ""}}, {**BASE, "meta": {"rps": 1}}),
    ({"$unset": {"meta.nothing.here": ""}}, BASE),
    ({"$unset": {"tags.0": ""}}, {**BASE, "tags": [None]}),
    ({"$inc": {"meta.rps": 2}}, {**BASE, "meta": {**BASE["meta"], "rps": 3}}),
    ({"$inc": {"meta.rps": -0.5}}, {**BASE, "meta": {**BASE["meta"], "rps": 0.5}}),
    ({"$inc": {"meta.fresh": 4}}, {**BASE, "meta": {**BASE["meta"], "fresh": 4}}),
    (
        {"$set": {"name": "n"}, "$inc": {"meta.rps": 1}, "$push": {"tags": "T"}},
        {"name": "n", "meta": {"region": "us-east-1", "rps": 2}, "tags": ["NLP", "T"]},
    ),
]


@pytest.mark.parametrize(("update", "expected"), UPDATES, ids=[str(u[0]) for u in UPDATES])
async def test_updates(conn: AsyncConnection, update: Any, expected: Any) -> None:
    assert await updated(conn, BASE, update) == (expected, None)


async def test_pull_with_conditions_and_documents(conn: AsyncConnection) -> None:
    doc = {"n": [1, 5, 10, "x"], "d": [{"a": 1, "b": 2}, {"a": 2}]}
    assert await updated(conn, doc, {"$pull": {"n": {"$gte": 5}}}) == (
        {**doc, "n": [1, "x"]},
        None,
    )
    assert await updated(conn, doc, {"$pull": {"d": {"a": 1}}}) == ({**doc, "d": [{"a": 2}]}, None)


STUCK: list[tuple[Any, str]] = [
    ({"$inc": {"name": 1}}, "update.$inc.name"),
    ({"$push": {"name": "x"}}, "update.$push.name"),
    ({"$addToSet": {"meta": "x"}}, "update.$addToSet.meta"),
    ({"$pull": {"meta.region": "x"}}, "update.$pull.meta.region"),
    ({"$set": {"name.first": "x"}}, "update.$set.name.first"),
    ({"$set": {"meta.rps.x.y": 1}}, "update.$set.meta.rps.x.y"),
    ({"$set": {"tags.x": "y"}}, "update.$set.tags.x"),
    ({"$set": {"meta.ok": 1}, "$inc": {"meta.region": 1}}, "update.$inc.meta.region"),
]


@pytest.mark.parametrize(("update", "location"), STUCK)
async def test_updates_that_cannot_apply(conn: AsyncConnection, update: Any, location: str) -> None:
    doc, where = await updated(conn, BASE, update)
    assert where == location


REFUSED_UPDATES: list[tuple[Any, str]] = [
    ({"$foo": {"a": 1}}, "update.$foo"),
    ({"name": "x"}, "update.name"),
    ({}, "update"),
    ([], "update"),
    ({"$set": {}}, "update.$set"),
    ({"$set": 1}, "update.$set"),
    ({"$inc": {"a": "1"}}, "update.$inc.a"),
    ({"$inc": {"a": True}}, "update.$inc.a"),
    ({"$push": {"a": {"$each": [1], "$slice": 2}}}, "update.$push.a.$slice"),
    ({"$push": {"a": {"$each": 1}}}, "update.$push.a.$each"),
    ({"$pull": {"a": {"$regex": "x"}}}, "update.$pull.a.$regex"),
    ({"$set": {"a.$": 1}}, "update.$set.a.$"),
    ({"$set": {"a.b": 1}, "$unset": {"a": ""}}, "update.$unset.a"),
    ({"$set": {"a": 1}, "$inc": {"a": 1}}, "update.$inc.a"),
]


@pytest.mark.parametrize(("update", "location"), REFUSED_UPDATES)
def test_refused_updates(update: Any, location: str) -> None:
    with pytest.raises(MongoError) as refused:
        parse_update(update)
    assert refused.value.location == location
