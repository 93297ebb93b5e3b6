"""Running tasks on this cluster's blocks: the gateway's :class:`~gateway.executor.Executor`.

A task on a block becomes a prediction on the block's deployment (or version) stream, the
durable path the api's ``POST /v1/predictions`` takes: stored, then queued
(:func:`director.submit.submit`), claimed by a director, fenced, retried, dead-lettered. Its
answer is collected from its event stream by the process's one reader
(:class:`tracker.event_hub.EventHub`), as ``Prefer: wait`` is. A block marked synchronous runs
through the ``/run`` lane instead when this gateway joins it (no durable write on the hot
path).

Before anything is stored the task is checked: the block resolved (``NOT_FOUND``), a ready
runner known for it (``UNAVAILABLE``), the predictions it makes within the account's rate of
creates, the api's own (``tracker.rate_limits``: ``RESOURCE_EXHAUSTED`` with ``retry-after``;
a graph's steps counted together), its input valid for the block's schema and storable
(``INVALID_ARGUMENT`` naming the field). Then its files are stored and the prediction made.

The prediction gets the call's deadline as its own (``deadline``: the director fails it past
that), and a call that ends before its prediction does (canceled by the client, or out of
time) cancels it. A task with a graph (``output_ptr``) runs each step as such a prediction
(:mod:`gateway.graphs.run`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from blocks import named_graphs
from catalog.records import AccountInfo
from core.ids import new_prediction_id
from front.admission import new_prediction
from front.destinations import Destination
from gateway import block_input
from gateway.destinations import Destinations, block_of, unknown_block
from gateway.errors import (
    FailedPrecondition,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from gateway.executor import OutputFile, TaskResult
from gateway.graphs.named import GRAPH_ID, RefusedGraph, compile_graph, run_named_graph
from gateway.graphs.plan import GraphPlan, plan_graph
from gateway.graphs.run import run_graph
from gateway.lane_runs import run_on_lane
from gateway.peers import PeerAnswer, RemoteBlock
from gateway.prediction_end import cancel_prediction, final_state, outcome, wall_deadline
from gateway.resources import GatewayResources
from gateway.search_routes import SearchRoutes
from gateway.session_routes import SessionRoutes, graph_digest
from gateway.task import InputFile, Task
from tracker.events import EventType
from tracker.input_checks import RefusedInput
from tracker.rate_limits import OverRate

log = logging.getLogger(__name__)

#: Where a block of a graph runs: here, or on another cluster.
Route = Destination | RemoteBlock
#: What ``predictions.source`` says of the predictions the gateway makes.
SOURCE = "gateway"


class BlockExecutor:
    def __init__(self, resources: GatewayResources) -> None:
        self.resources = resources
        settings = resources.settings
        self.routes = SessionRoutes(resources.redis, settings.route_ttl)
        self.admission = resources.front.admission
        self.destinations = Destinations(
            resources.front.resolver,
            resources.fleet,
            settings.cache_ttl,
            self.routes,
            resources.remote,
        )
        self.search = SearchRoutes(
            settings.cluster_id,
            resources.registry_engine,
            self.destinations,
            self.routes,
            resources.queue,
            resources.peers,
        )

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> TaskResult:
        if GRAPH_ID.fullmatch(task.block_id):
            return TaskResult(await self._named_graph(account, task, deadline))
        if task.output_ptr is not None:
            return TaskResult(await self._graph(account, task, deadline))
        destination = await self._route(account, task)
        if isinstance(destination, RemoteBlock):
            await self.destinations.check_served(destination)
            answer = await self._remote(
                account, destination, task.data, deadline, task.files, task.frame_ptr
            )
            return TaskResult(answer.data, [OutputFile(*f) for f in answer.files])
        await self._count_creates(account, 1)
        input, input_json = await self._checked_input(account, destination, task)
        return TaskResult(await self._step(account, destination, input, input_json, deadline))

    async def stream(
        self, account: AccountInfo, task: Task, deadline: float | None
    ) -> AsyncIterator[Any]:
        if task.output_ptr is None and not GRAPH_ID.fullmatch(task.block_id):
            destination = await self._route(account, task)
            if isinstance(destination, Destination) and not (
                destination.synchronous and self.resources.lane is not None
            ):
                await self._count_creates(account, 1)
                input, input_json = await self._checked_input(account, destination, task)
                async for item in self._durable(
                    account, destination, input, input_json, deadline, True
                ):
                    yield item
                return
        # A graph answers once its leaves have; so does the lane here.
        yield (await self.run(account, task, deadline)).data

    async def _count_creates(self, account: AccountInfo, count: int) -> None:
        """Count the predictions a task makes against the account's rate of creates (as the
        api counts its own): past it, ``RESOURCE_EXHAUSTED`` with ``retry-after``."""
        try:
            await self.admission.count_creates(account.id, count)
        except OverRate as over:
            wait = over.retry_after
            trailing = (("retry-after", str(wait)),) if wait is not None else ()
            raise ResourceExhausted(over.detail, trailing=trailing) from None

    # -- one block --------------------------------------------------------------------------

    async def _route(self, account: AccountInfo, task: Task) -> Route:
        """Where the task's block runs: the block it names, else the one its search chose."""
        if not task.block_id and task.query_parameters is not None:
            return await self.search.route(account, task)
        return await self.destinations.resolve_route(
            account, task.block_id, session_id=task.session_id
        )

    async def _remote(
        self,
        account: AccountInfo,
        remote: RemoteBlock,
        data: dict[str, Any],
        deadline: float | None,
        files: list[InputFile] | None = None,
        frame_ptr: bytes = b"",
    ) -> PeerAnswer:
        """Run ``data`` (with ``files``, and the task's frame) on another cluster's block."""
        peers = self.resources.peers
        assert peers is not None  # a remote block is only found with a cluster id
        if deadline is None:
            deadline = time.monotonic() + self.resources.settings.default_deadline
        return await peers.infer(remote, account, data, deadline, files, frame_ptr)

    async def _checked_input(
        self, account: AccountInfo, destination: Destination, task: Task
    ) -> tuple[dict[str, Any], bytes]:
        """The task's input, checked and its files stored; and its canonical JSON."""
        await self.destinations.check_served(destination)
        await self._check_with_files(account, destination, block_input.compose(task))
        input = await block_input.attach_files(self.resources.files, account.id, task)
        return input, self._canonical(input)

    async def _check_with_files(
        self, account: AccountInfo, destination: Destination, input: dict[str, Any]
    ) -> None:
        """:meth:`_check`, and refuse file references (``/v1/files/{id}`` URLs) to anything
        but the account's own live uploads."""
        self._check(destination, input)
        try:
            await self.admission.files(account.id, input, root="data")
        except RefusedInput as refused:
            raise InvalidArgument(refused.detail) from None

    def _check(self, destination: Destination, input: dict[str, Any]) -> None:
        """The front door's input check, under ``data``. Undeclared fields pass: a graph's
        step is handed its parent's whole output."""
        try:
            self.admission.input(destination, input, "data", declared_only=False)
        except RefusedInput as refused:
            raise InvalidArgument(refused.detail) from None

    def _canonical(self, input: dict[str, Any]) -> bytes:
        try:
            return self.admission.canonical(input, "data")
        except RefusedInput as refused:
            raise InvalidArgument(refused.detail) from None

    async def _step(
        self,
        account: AccountInfo,
        destination: Destination,
        input: dict[str, Any],
        input_json: bytes,
        deadline: float | None,
        graph: dict[str, Any] | None = None,
    ) -> Any:
        lane = self.resources.lane
        if destination.synchronous and lane is not None and graph is None:
            return await run_on_lane(
                lane, self.resources.files, account, destination, input, input_json, deadline
            )
        output: Any = None
        async for item in self._durable(
            account, destination, input, input_json, deadline, False, graph
        ):
            output = item
        return output

    async def _durable(
        self,
        account: AccountInfo,
        destination: Destination,
        input: dict[str, Any],
        input_json: bytes,
        deadline: float | None,
        streaming: bool,
        graph: dict[str, Any] | None = None,
    ) -> AsyncIterator[Any]:
        """Store and queue the prediction, then follow its events: with ``streaming``, each
        output chunk as it comes (then the output, when none came); else the output alone."""
        resources = self.resources
        block = block_of(destination)
        new = new_prediction(
            account,
            destination,
            input,
            input_json,
            deadline=wall_deadline(deadline),
            source=SOURCE,
            graph=graph,
        )
        subscription = resources.hub.subscribe(new.id, account=account.id)
        if subscription is None:
            if resources.hub.released:
                raise Unavailable("the gateway is shutting down")
            raise ResourceExhausted("this gateway holds its most tasks in flight")
        finished = False
        try:
            await resources.front.durable.submit(new, destination.target)
            chunks = 0
            async for event in subscription:
                if event.type is EventType.OUTPUT and streaming:
                    chunks += 1
                    yield event.data
                elif event.type is EventType.DONE:
                    finished = True
                    final = await final_state(
                        resources.engine, account.id, new.id, event.prediction
                    )
                    output = outcome(block.id, final)
                    if not streaming or chunks == 0:
                        yield output
                    return
            raise Unavailable("the gateway is shutting down")
        finally:
            subscription.close()
            if not finished:
                # The call ended first (canceled, out of time, the gateway stopping): so does
                # the prediction; shielded, so that the cancel is sent whatever cancels us.
                await asyncio.shield(cancel_prediction(resources, account.id, new.id))

    # -- graphs -----------------------------------------------------------------------------

    async def _plan(self, account: AccountInfo, task: Task) -> GraphPlan[Route]:
        """The task's graph checked and its blocks resolved; within a session, a graph it ran
        before skips the checks (its plan is kept for the session, ``route_ttl``)."""
        settings = self.resources.settings
        session = task.session_id

        def find(block_id: str) -> Awaitable[Route | None]:
            return self.destinations.route(account, block_id, session)

        digest = graph_digest(task.output_ptr, task.block_id)
        kept = await self.routes.graph(account.id, session, digest) if session else None
        if kept is not None:
            found = await asyncio.gather(*(find(node) for node in kept["order"]))
            if all(found):
                return GraphPlan(
                    head=task.block_id,
                    order=tuple(kept["order"]),
                    parents={node: tuple(p) for node, p in kept["parents"].items()},
                    children={node: tuple(c) for node, c in kept["children"].items()},
                    resolved={n: d for n, d in zip(kept["order"], found, strict=True) if d},
                    roots=(task.block_id,),
                    leaves=tuple(kept["leaves"]),
                )
        plan: GraphPlan[Route] = await plan_graph(
            task.output_ptr,
            task.block_id,
            find,
            max_nodes=settings.graph_max_nodes,
            max_fanout=settings.graph_max_fanout,
        )
        if session:
            skeleton = {
                "order": plan.order,
                "parents": plan.parents,
                "children": plan.children,
                "leaves": plan.leaves,
            }
            await self.routes.keep_graph(account.id, session, digest, skeleton)
        return plan

    async def _graph(self, account: AccountInfo, task: Task, deadline: float | None) -> Any:
        settings = self.resources.settings
        plan = await self._plan(account, task)
        head = plan.resolved[task.block_id]
        for node in plan.order:
            await self.destinations.check_served(plan.resolved[node])
        # Every step here is a prediction of its own; another cluster's count there.
        await self._count_creates(
            account, sum(isinstance(plan.resolved[node], Destination) for node in plan.order)
        )
        if isinstance(head, Destination):
            await self._check_with_files(account, head, block_input.compose(task))
            head_input = await block_input.attach_files(self.resources.files, account.id, task)
        else:  # checked, its files stored, by the cluster that runs it
            head_input = task.data
        graph_id = new_prediction_id()

        async def run_step(step: str, destination: Route, data: Any, until: float) -> Any:
            head = step == task.block_id
            if head:
                input = head_input
            elif isinstance(data, dict):
                input = data
            else:
                raise InvalidArgument(
                    f"the step's input must be an object; its parent's output is "
                    f"{type(data).__name__}"
                )
            if isinstance(destination, RemoteBlock):
                files = task.files if head else None
                sent = await self._remote(account, destination, input, until, files, task.frame_ptr)
                return sent.data
            if task.frame_ptr and block_input.FRAME_PTR_FIELD not in input:
                input = {
                    **input,
                    block_input.FRAME_PTR_FIELD: block_input.frame_ptr_text(task.frame_ptr),
                }
            input_json = self._canonical(input)
            if not head:
                self._check(destination, input)
            link = {"id": graph_id, "step": step, "head": task.block_id}
            return await self._step(account, destination, input, input_json, until, link)

        until = deadline if deadline is not None else time.monotonic() + settings.default_deadline
        return await run_graph(plan, head_input, run_step, until, settings.graph_max_inflight)

    async def _named_graph(self, account: AccountInfo, task: Task, deadline: float | None) -> Any:
        """A registered graph (``gph-…`` in ``block_id``): checked again against the blocks as
        the account sees them now, each step run as a seed graph's step is."""
        settings = self.resources.settings
        stored = await named_graphs.get(self.resources.engine, account.id, task.block_id)
        if stored is None:
            raise unknown_block(task.block_id)
        session = task.session_id
        try:
            compiled = await compile_graph(
                stored.spec, lambda block_id: self.destinations.find(account, block_id, session)
            )
        except RefusedGraph as refused:
            raise FailedPrecondition(
                f"graph {stored.id} no longer fits its blocks: {refused.detail}"
            ) from None
        for destination in compiled.blocks.values():
            await self.destinations.check_served(destination)
        await self._count_creates(account, len(compiled.blocks))
        self._canonical(block_input.compose(task))
        data = await block_input.attach_files(self.resources.files, account.id, task)
        graph_id = new_prediction_id()

        async def run_step(step: str, destination: Destination, input: Any, until: float) -> Any:
            input_json = self._canonical(input)
            self._check(destination, input)
            link = {"id": graph_id, "step": step, "graph": stored.id}
            return await self._step(account, destination, input, input_json, until, link)

        until = deadline if deadline is not None else time.monotonic() + settings.default_deadline
        return await run_named_graph(compiled, data, run_step, until, settings.graph_max_inflight)
