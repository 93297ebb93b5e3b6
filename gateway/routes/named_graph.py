"""The named-graph route: a registered graph (``gph-…`` in ``block_id``), checked again
against its blocks as the account sees them now, each step run here as a graph's step is."""

from __future__ import annotations

import time
from typing import Any

from blocks import named_graphs
from catalog.records import AccountInfo
from core.ids import new_prediction_id
from front.destinations import Destination
from gateway import block_input
from gateway.destinations import Destinations, unknown_block
from gateway.errors import FailedPrecondition
from gateway.graphs.named import RefusedGraph, compile_graph, run_named_graph
from gateway.resources import GatewayResources
from gateway.routes.admit import TaskAdmission
from gateway.routes.step import BlockStep
from gateway.task import Task


class NamedGraphRoute:
    def __init__(
        self,
        resources: GatewayResources,
        destinations: Destinations,
        admit: TaskAdmission,
        step: BlockStep,
    ) -> None:
        self.resources = resources
        self.destinations = destinations
        self.admit = admit
        self.step = step

    async def run(self, account: AccountInfo, task: Task, deadline: float | None) -> Any:
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
        await self.admit.count_creates(account, len(compiled.blocks))
        self.admit.canonical(block_input.compose(task))
        data = await block_input.attach_files(self.resources.files, account.id, task)
        graph_id = new_prediction_id()

        async def run_step(step: str, destination: Destination, input: Any, until: float) -> Any:
            input_json = self.admit.canonical(input)
            self.admit.check(destination, input)
            link = {"id": graph_id, "step": step, "graph": stored.id}
            return await self.step.run(account, destination, input, input_json, until, link)

        until = deadline if deadline is not None else time.monotonic() + settings.default_deadline
        return await run_named_graph(compiled, data, run_step, until, settings.graph_max_inflight)
