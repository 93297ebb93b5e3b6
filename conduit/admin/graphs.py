"""``conduit admin list-graphs``, ``show-graph``, ``delete-graph``: an account's named graphs
(what ``POST /v1/graphs`` stores for the gateway to run). A graph is its account's, so each
command names the account."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from conduit.admin.running import with_engine
from conduit.admin.tables import add_list_options, listing, to_json, when
from tracker import catalog, named_graphs
from tracker.named_graphs import StoredGraph

GRAPH_COLUMNS = ("ID", "NAME", "STEPS", "CREATED")


def _row(graph: StoredGraph) -> tuple[str, ...]:
    steps = graph.spec.get("steps") if isinstance(graph.spec, dict) else None
    count = str(len(steps)) if isinstance(steps, list) else "-"
    return (graph.id, graph.name, count, when(graph.created_at))


async def _account_id(engine: AsyncEngine, name: str) -> int:
    account = await catalog.get_account(engine, name)
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


def cmd_list_graphs(args: argparse.Namespace) -> None:
    found = with_engine(lambda engine: list_graphs(engine, args.account, args.limit))
    if args.json:  # as GET /v1/graphs renders them
        print(to_json([named_graphs.render(graph) for graph in found]))
        return
    print(listing(found, GRAPH_COLUMNS, _row, as_json=False, empty="no graphs"))


def cmd_show_graph(args: argparse.Namespace) -> None:
    print(to_json(with_engine(lambda engine: show_graph(engine, args.account, args.graph_id))))


def cmd_delete_graph(args: argparse.Namespace) -> None:
    print(with_engine(lambda engine: delete_graph(engine, args.account, args.graph_id)))


def add_graphs(admin_sub: Any) -> None:
    listed = admin_sub.add_parser("list-graphs", help="list an account's named graphs")
    listed.add_argument("account", metavar="ACCOUNT")
    add_list_options(listed)
    listed.set_defaults(func=cmd_list_graphs)
    shown = admin_sub.add_parser("show-graph", help="print an account's graph (its spec) as JSON")
    shown.add_argument("account", metavar="ACCOUNT")
    shown.add_argument("graph_id", metavar="GRAPH_ID")
    shown.set_defaults(func=cmd_show_graph)
    deleted = admin_sub.add_parser("delete-graph", help="delete an account's graph")
    deleted.add_argument("account", metavar="ACCOUNT")
    deleted.add_argument("graph_id", metavar="GRAPH_ID")
    deleted.set_defaults(func=cmd_delete_graph)
