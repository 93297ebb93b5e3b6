"""Where a task named by a search (``query_parameters``, no ``block_id``) runs: the search of
:mod:`gateway.search` over this gateway's registry, with what it needs from the gateway — which
found blocks the account may use, each candidate's load and latency — and the session's kept
choice (``session_id → block_id, connection``)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from blocks import inference_servers
from blocks.graphs.schemas import block_of
from catalog.records import AccountInfo
from director.queue import Queue
from front.destinations import Destination
from gateway.destinations import Destinations
from gateway.errors import FailedPrecondition
from gateway.peers import Peers, RemoteBlock
from gateway.ranking import Candidate
from gateway.search import BlockSearch, Found, parse_query
from gateway.session_routes import SessionRoutes
from gateway.task import Task


class SearchRoutes:
    def __init__(
        self,
        cluster_id: str | None,
        registry_engine: AsyncEngine | None,
        destinations: Destinations,
        routes: SessionRoutes,
        queue: Queue,
        peers: Peers | None,
    ) -> None:
        self.cluster_id = cluster_id
        self.destinations = destinations
        self.routes = routes
        self.queue = queue
        self.peers = peers
        self.search: BlockSearch | None = None
        if cluster_id is not None and registry_engine is not None:
            engine = registry_engine

            async def search(servers: object, blocks: object) -> list[Found]:
                found = await inference_servers.search_blocks(engine, servers, blocks)
                return [
                    Found(
                        f.block_id,
                        f.server.cluster_id or "",
                        f.metadata,
                        f.public,
                        f.server.public_url,
                    )
                    for f in found
                ]

            async def count(servers: object) -> int:
                return await inference_servers.count_alive(engine, servers)

            self.search = BlockSearch(cluster_id, search, count)

    async def route(self, account: AccountInfo, task: Task) -> Destination | RemoteBlock:
        """The block the task's search chose (kept for its session)."""
        assert task.query_parameters is not None
        if self.search is None:
            raise FailedPrecondition(
                "search looks in the registry: this gateway needs a cluster id"
                " (CONDUIT_CLUSTER_ID)",
                "query_parameters",
            )
        query = parse_query(task.query_parameters)
        session = task.session_id
        kept = await self.routes.search(account.id, session, query.digest) if session else None
        if kept is None:

            async def usable(found: Found) -> bool:
                if found.cluster_id == self.cluster_id:
                    return await self.destinations.find(account, found.block_id) is not None
                return found.public

            async def describe(found: Found) -> Candidate:
                return await self._candidate(account, found)

            chosen = await self.search.choose(query, session, usable, describe)
            kept = {"block_id": chosen.block_id, "cluster_id": chosen.cluster_id, "url": chosen.url}
            if session:
                await self.routes.keep_search(account.id, session, query.digest, kept)
        if kept["cluster_id"] == self.cluster_id:
            return await self.destinations.resolve(account, kept["block_id"], "query_parameters")
        return RemoteBlock(kept["block_id"], kept["cluster_id"], kept["url"])

    async def _candidate(self, account: AccountInfo, found: Found) -> Candidate:
        if found.cluster_id != self.cluster_id:
            latency = self.peers.latency(found.cluster_id) if self.peers is not None else None
            return Candidate(found.block_id, found.cluster_id, False, found.metadata, None, latency)
        destination = await self.destinations.find(account, found.block_id)
        load = await self._load(destination) if destination is not None else None
        return Candidate(found.block_id, found.cluster_id, True, found.metadata, load, 0.0)

    async def _load(self, destination: Destination) -> float:
        """Tasks waiting per ready runner slot of the block's deployment (or version)."""
        target = destination.target
        backlog = await self.queue.backlog([target.stream(s) for s in range(target.shards)])
        waiting = sum(b.waiting for b in backlog)
        fleet = self.destinations.fleet
        block = block_of(destination)
        runners = (
            fleet.runners_for(block.deployment)
            if block.deployment is not None
            else fleet.runners_serving(destination.version.id)
        )
        slots = sum(r.concurrency for r in runners)
        return waiting / slots if slots else float("inf")
