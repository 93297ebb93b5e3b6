"""``conduit admin list-graphs``, ``show-graph``, ``delete-graph``: an account's named graphs
(what ``POST /v1/graphs`` stores for the gateway to run). A graph is its account's, so each
command names the account."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import named_graphs
from blocks.named_graphs import StoredGraph
from catalog import lookups
from conduit.admin.collection import Collection
from conduit.admin.tables import when

GRAPH_COLUMNS = ("ID", "NAME", "STEPS", "CREATED")


def _row(graph: StoredGraph) -> tuple[str, ...]:
    steps = graph.spec.get("steps") if isinstance(graph.spec, dict) else None
    count = str(len(steps)) if isinstance(steps, list) else "-"
    return (graph.id, graph.name, count, when(graph.created_at))


async def _account_id(engine: AsyncEngine, name: str) -> int:
    account = await lookups.get_account(engine, name)
    if account is None:
        raise SystemExit(f"account {name} does not exist")
    return account.id


async def list_graphs(engine: AsyncEngine, account: str, limit: int) -> list[StoredGraph]:
    return await named_graphs.list_graphs(engine, await _account_id(engine, account), limit=limit)


async def show_graph(engine: AsyncEngine, account: str, graph_id: str) -> dict[str, Any]:
    found = await named_graphs.get(engine, await _account_id(engine, account), graph_id)
    if found is None:
        raise SystemExit(f"account {account} has no graph {graph_id}")
    return named_graphs.render(found)


async def delete_graph(engine: AsyncEngine, account: str, graph_id: str) -> str:
    if not await named_graphs.delete_graph(engine, await _account_id(engine, account), graph_id):
        raise SystemExit(f"account {account} has no graph {graph_id}")
    return f"deleted graph {graph_id} of {account}"


GRAPHS: Collection[StoredGraph] = Collection(
    noun="graph",
    metavar="GRAPH_ID",
    columns=GRAPH_COLUMNS,
    row=_row,
    read_all=lambda engine, args: list_graphs(engine, args.account, args.limit),
    read_one=lambda engine, args: show_graph(engine, args.account, args.name),
    delete=lambda engine, args: delete_graph(engine, args.account, args.name),
    catalog_change=False,
    per_account=True,
    render=lambda found: [named_graphs.render(graph) for graph in found],  # as GET /v1/graphs
)


def add_graphs(admin_sub: Any) -> None:
    GRAPHS.add(
        admin_sub,
        list_help="list an account's named graphs",
        show_help="print an account's graph (its spec) as JSON",
        delete_help="delete an account's graph",
    )
