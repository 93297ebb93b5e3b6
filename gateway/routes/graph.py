"""The graph route: a task with a graph (``output_ptr``, the seed's adjacency under ``graph``)
run from its head block, each step where its block runs (here, as a prediction of its own or
through the lane, or on the cluster that publishes it), parents' outputs handed to their
children. The plan (the graph checked, its blocks resolved) is kept for the task's session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from catalog.records import AccountInfo
from core.ids import new_prediction_id
from front.destinations import Destination
from gateway import block_input
from gateway.destinations import Destinations
from gateway.errors import InvalidArgument
from gateway.graphs.plan import GraphPlan, plan_graph
from gateway.graphs.run import run_graph
from gateway.peers import RemoteBlock
from gateway.resources import GatewayResources
from gateway.routes.admit import TaskAdmission
from gateway.routes.peer import PeerRoute
from gateway.routes.step import BlockStep
from gateway.session_routes import SessionRoutes, graph_digest
from gateway.task import Task

#: Where a block of a graph runs: here, or on another cluster.
Route = Destination | RemoteBlock


class GraphRoute:
    def __init__(
        self,
        resources: GatewayResources,
        destinations: Destinations,
        sessions: SessionRoutes,
        admit: TaskAdmission,
        peer: PeerRoute,
        step: BlockStep,
    ) -> None:
        self.resources = resources
        self.destinations = destinations
        self.sessions = sessions
        self.admit = admit
        self.peer = peer
        self.step = step

    async def plan(self, account: AccountInfo, task: Task) -> GraphPlan[Route]:
        """The task's graph checked and its blocks resolved; within a session, a graph it ran
        before skips the checks (its plan is kept for the session, ``route_ttl``)."""
        settings = self.resources.settings
        session = task.session_id

        def find(block_id: str) -> Awaitable[Route | None]:
            return self.destinations.route(account, block_id, session)

        digest = graph_digest(task.output_ptr, task.block_id)
        kept = await self.sessions.graph(account.id, session, digest) if session else None
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
            await self.sessions.keep_graph(account.id, session, digest, skeleton)
        return plan

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> Any:
        """The graph's answer: its leaves' outputs, each step run where its block runs."""
        settings = self.resources.settings
        plan = await self.plan(account, task)
        head = plan.resolved[task.block_id]
        for node in plan.order:
            await self.destinations.check_served(plan.resolved[node])
        # Every step here is a prediction of its own; another cluster's count there.
        await self.admit.count_creates(
            account, sum(isinstance(plan.resolved[node], Destination) for node in plan.order)
        )
        if isinstance(head, Destination):
            await self.admit.check_with_files(account, head, block_input.compose(task))
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
                sent = await self.peer.run(
                    account, destination, input, until, files, task.frame_ptr
                )
                return sent.data
            if task.frame_ptr and block_input.FRAME_PTR_FIELD not in input:
                input = {
                    **input,
                    block_input.FRAME_PTR_FIELD: block_input.frame_ptr_text(task.frame_ptr),
                }
            input_json = self.admit.canonical(input)
            if not head:
                self.admit.check(destination, input)
            link = {"id": graph_id, "step": step, "head": task.block_id}
            return await self.step.run(account, destination, input, input_json, until, link)

        until = deadline if deadline is not None else time.monotonic() + settings.default_deadline
        return await run_graph(plan, head_input, run_step, until, settings.graph_max_inflight)
