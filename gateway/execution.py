"""Running tasks on this cluster's blocks: the gateway's :class:`~gateway.executor.Executor`, a
small dispatcher over the route strategies of :mod:`gateway.routes`.

A task names a registered graph (``gph-…``: the named-graph route), carries a graph
(``output_ptr``: the graph route), or names one block, directly or by a search
(``query_parameters``). One block runs where it is published: on another cluster (the peer
route), through the synchronous lane (a block marked synchronous, when this gateway joins the
lane) or as a prediction on the block's stream (the durable route, the path the api's
``POST /v1/predictions`` takes).

Before anything is stored the task goes through the front door (:mod:`front`): the block
resolved (``NOT_FOUND``), a ready runner known for it (``UNAVAILABLE``), the predictions it
makes within the account's rate of creates, the api's own (``RESOURCE_EXHAUSTED`` with
``retry-after``; a graph's steps counted together), its input valid for the block's schema and
storable (``INVALID_ARGUMENT`` naming the field). Then its files are stored and the prediction
made.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from catalog.records import AccountInfo
from front.destinations import Destination
from gateway.destinations import Destinations
from gateway.executor import OutputFile, TaskResult
from gateway.graphs.named import GRAPH_ID
from gateway.peers import RemoteBlock
from gateway.resources import GatewayResources
from gateway.routes.admit import TaskAdmission
from gateway.routes.durable import DurableRoute
from gateway.routes.graph import GraphRoute, Route
from gateway.routes.named_graph import NamedGraphRoute
from gateway.routes.peer import PeerRoute
from gateway.routes.step import BlockStep
from gateway.search_routes import SearchRoutes
from gateway.session_routes import SessionRoutes
from gateway.task import Task


class BlockExecutor:
    def __init__(self, resources: GatewayResources) -> None:
        settings = resources.settings
        sessions = SessionRoutes(resources.redis, settings.route_ttl)
        self.destinations = Destinations(
            resources.front.resolver,
            resources.fleet,
            settings.cache_ttl,
            sessions,
            resources.remote,
        )
        self.search = SearchRoutes(
            settings.cluster_id,
            resources.registry_engine,
            self.destinations,
            sessions,
            resources.queue,
            resources.peers,
        )
        self.admit = TaskAdmission(resources.front.admission, self.destinations, resources.files)
        self.durable = DurableRoute(resources)
        self.peer = PeerRoute(resources)
        self.step = BlockStep(resources, self.durable)
        self.graph = GraphRoute(
            resources, self.destinations, sessions, self.admit, self.peer, self.step
        )
        self.named_graph = NamedGraphRoute(resources, self.destinations, self.admit, self.step)

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> TaskResult:
        if GRAPH_ID.fullmatch(task.block_id):
            return TaskResult(await self.named_graph.run(account, task, deadline))
        if task.output_ptr is not None:
            return TaskResult(await self.graph.run(account, task, deadline))
        destination = await self._route(account, task)
        if isinstance(destination, RemoteBlock):
            await self.destinations.check_served(destination)
            answer = await self.peer.run(
                account, destination, task.data, deadline, task.files, task.frame_ptr
            )
            return TaskResult(answer.data, [OutputFile(*f) for f in answer.files])
        await self.admit.count_creates(account, 1)
        input, input_json = await self.admit.checked_input(account, destination, task)
        return TaskResult(await self.step.run(account, destination, input, input_json, deadline))

    async def stream(
        self, account: AccountInfo, task: Task, deadline: float | None
    ) -> AsyncIterator[Any]:
        if task.output_ptr is None and not GRAPH_ID.fullmatch(task.block_id):
            destination = await self._route(account, task)
            if isinstance(destination, Destination) and not self.step.on_lane(destination):
                await self.admit.count_creates(account, 1)
                input, input_json = await self.admit.checked_input(account, destination, task)
                async for item in self.durable.follow(
                    account, destination, input, input_json, deadline, True
                ):
                    yield item
                return
        # A graph answers once its leaves have; so does the lane here.
        yield (await self.run(account, task, deadline)).data

    async def _route(self, account: AccountInfo, task: Task) -> Route:
        """Where the task's block runs: the block it names, else the one its search chose."""
        if not task.block_id and task.query_parameters is not None:
            return await self.search.route(account, task)
        return await self.destinations.resolve_route(
            account, task.block_id, session_id=task.session_id
        )
