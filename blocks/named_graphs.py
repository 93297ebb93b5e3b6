"""Named graphs: a graph of blocks registered by an account under a name, with explicit field
mappings (JMESPath), ``when`` conditions, per-step timeouts and ``return_steps``
(:mod:`blocks.graphs.specs` reads the spec). A task runs one by naming its id (``gph-`` and
eight lowercase letters or digits) where it would name a block.

A graph is its account's alone: another account reads, runs and deletes it as one that does
not exist. :func:`compile_graph` checks a spec against the blocks as the account sees them
(an unknown block and one it may not use are refused alike) and their schemas
(:mod:`blocks.graphs.schemas`); it runs at registration, and again before every run, since
blocks and their versions change after. :func:`explain` shows the plan it resolved.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import string
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from sqlalchemy import Table, and_, delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncEngine

from blocks.graphs.schemas import StepBlock, block_of, check_mappings
from blocks.graphs.specs import GraphSpec, RefusedGraph, parse_spec
from tracker.block_tables import Graph
from tracker.db import autocommit
from tracker.input_checks import FieldError
from tracker.keyset import PageKey, keyset_page
from tracker.render import iso

__all__ = [
    "GRAPH_ID",
    "CompiledGraph",
    "GraphNameTaken",
    "RefusedGraph",
    "StoredGraph",
    "compile_graph",
    "create",
    "delete_graph",
    "explain",
    "get",
    "list_graphs",
]

graphs = cast(Table, Graph.__table__)

GRAPH_ID = re.compile(r"gph-[a-z0-9]{8}")
_ALPHABET = string.ascii_lowercase + string.digits

B = TypeVar("B", bound=StepBlock)


class GraphNameTaken(ValueError):
    """The account has a graph of that name already."""


@dataclass(frozen=True, slots=True)
class StoredGraph:
    id: str
    account_id: int
    name: str
    spec: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class CompiledGraph(Generic[B]):
    """A spec that passed every check, with each step's block as resolved for the account."""

    spec: GraphSpec
    #: Step id → what its block resolved to.
    blocks: Mapping[str, B]


def new_graph_id() -> str:
    return "gph-" + "".join(secrets.choice(_ALPHABET) for _ in range(8))


async def compile_graph(
    raw: Any, resolve: Callable[[str], Awaitable[B | None]]
) -> CompiledGraph[B]:
    """The spec checked whole, or :class:`RefusedGraph` naming every fault found.

    ``resolve`` answers a block id with its block as the account sees it, or None (unknown
    and invisible alike); each distinct block is resolved once, concurrently, even when the
    spec has other faults, so that one answer lists them all."""
    spec, errors = parse_spec(raw)
    block_ids = list(dict.fromkeys(step.block for step in spec.steps))
    found = dict(zip(block_ids, await _resolve_all(resolve, block_ids), strict=True))
    resolved: dict[str, B] = {}
    for step in spec.steps:
        target = found[step.block]
        if target is None:
            errors.append(FieldError(f"{step.field}.block", f"unknown block {step.block}"))
        else:
            resolved.setdefault(step.id, target)
    errors.extend(check_mappings(spec, resolved))
    if errors:
        raise RefusedGraph(sorted(errors, key=_field_order))
    return CompiledGraph(spec, resolved)


async def _resolve_all(
    resolve: Callable[[str], Awaitable[B | None]], block_ids: list[str]
) -> list[B | None]:
    """Each block resolved, concurrently; when one lookup raises, the others are canceled
    and awaited before its error is raised (as itself, for the caller's error mapping)."""
    tasks = [asyncio.ensure_future(resolve(block_id)) for block_id in block_ids]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _field_order(error: FieldError) -> tuple[int, int, str]:
    """Refusals in the order of the spec: the graph's own fields, then step by step."""
    field = error.field
    if field.startswith("steps["):
        index = field[6 : field.index("]")]
        return (1, int(index) if index.isdigit() else 0, "")
    return (2 if field in ("output", "return_steps") else 0, 0, "")


def explain(
    compiled: CompiledGraph[B], served: Callable[[B], bool | None] | None = None
) -> dict[str, Any]:
    """The resolved plan, nothing run: the steps in the order they may start (each after
    what it needs), where each runs, whether a ready runner serves it now (``served``; None
    where that is not known), and what it is given."""
    spec = compiled.spec
    steps = []
    for step_id in spec.order:
        step = spec.step(step_id)
        target = compiled.blocks[step_id]
        block = block_of(target)
        steps.append(
            {
                "id": step.id,
                "block": block.id,
                "model": block.model,
                "deployment": block.deployment,
                "version": target.version.id,
                "synchronous": block.synchronous,
                "served": served(target) if served is not None else None,
                "needs": list(step.needs),
                "input": {name: e.text for name, e in step.input.items()},
                "when": step.when.text if step.when is not None else None,
                "timeout": step.timeout,
            }
        )
    return {
        "name": spec.name,
        "steps": steps,
        "output": output_text(spec),
        "return_steps": spec.return_steps,
    }


def output_text(spec: GraphSpec) -> str:
    """The ``output`` expression, or the default's (the last listed step's output)."""
    if spec.output is not None:
        return spec.output.text
    return f"steps.{spec.steps[-1].id}.output"


def render(graph: StoredGraph) -> dict[str, Any]:
    return {
        "id": graph.id,
        "name": graph.name,
        "spec": graph.spec,
        "created_at": iso(graph.created_at),
    }


# -- storage ----------------------------------------------------------------------------------

_COLUMNS = (graphs.c.id, graphs.c.account_id, graphs.c.name, graphs.c.spec, graphs.c.created_at)


def _graph(row: Any) -> StoredGraph:
    return StoredGraph(row[0], row[1], row[2], row[3], row[4])


async def create(
    engine: AsyncEngine, account_id: int, name: str, spec: dict[str, Any]
) -> StoredGraph:
    """Store a checked spec as the account's graph ``name``; :class:`GraphNameTaken` when the
    account has one of that name."""
    async with autocommit(engine).connect() as conn:
        while True:  # a new id that collides with one in use is drawn again
            inserted = await conn.execute(
                pg_insert(graphs)
                .values(id=new_graph_id(), account_id=account_id, name=name, spec=spec)
                .on_conflict_do_nothing()
                .returning(*_COLUMNS)
            )
            row = inserted.first()
            if row is not None:
                return _graph(row)
            taken = await conn.execute(
                select(graphs.c.id).where(
                    and_(graphs.c.account_id == account_id, graphs.c.name == name)
                )
            )
            if taken.first() is not None:
                raise GraphNameTaken(name)


async def get(engine: AsyncEngine, account_id: int, graph_id: str) -> StoredGraph | None:
    """The account's graph, or None (no such graph, or another account's)."""
    if not GRAPH_ID.fullmatch(graph_id):
        return None
    query = select(*_COLUMNS).where(
        and_(graphs.c.id == graph_id, graphs.c.account_id == account_id)
    )
    async with autocommit(engine).connect() as conn:
        row = (await conn.execute(query)).first()
    return _graph(row) if row is not None else None


async def list_graphs(
    engine: AsyncEngine,
    account_id: int,
    *,
    after: PageKey | None = None,
    before: PageKey | None = None,
    limit: int = 100,
) -> list[StoredGraph]:
    """The account's graphs, newest first; ``after`` pages towards older ones, ``before``
    towards newer ones."""
    query = select(*_COLUMNS).where(graphs.c.account_id == account_id)
    query = keyset_page(query, graphs.c.created_at, graphs.c.id, after=after, before=before)
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(query.limit(limit))).all()
    found = [_graph(row) for row in rows]
    return found[::-1] if before is not None else found


async def delete_graph(engine: AsyncEngine, account_id: int, graph_id: str) -> bool:
    """Delete the account's graph; False when it has none of that id."""
    if not GRAPH_ID.fullmatch(graph_id):
        return False
    statement = delete(Graph).where(and_(Graph.id == graph_id, Graph.account_id == account_id))
    async with autocommit(engine).connect() as conn:
        deleted = await conn.execute(statement.returning(Graph.id))
        return deleted.first() is not None
