"""One block run here, its input admitted already: through the synchronous lane when the block
is marked synchronous and this gateway joins the lane (never a graph's step, which is recorded
with its graph), else on the durable route."""

from __future__ import annotations

from typing import Any

from catalog.records import AccountInfo
from front.destinations import Destination
from gateway.resources import GatewayResources
from gateway.routes.durable import DurableRoute
from gateway.routes.lane import run_on_lane


class BlockStep:
    def __init__(self, resources: GatewayResources, durable: DurableRoute) -> None:
        self.resources = resources
        self.durable = durable

    async def run(
        self,
        account: AccountInfo,
        destination: Destination,
        input: dict[str, Any],
        input_json: bytes,
        deadline: float | None,
        graph: dict[str, Any] | None = None,
    ) -> Any:
        """The block's output for ``input``."""
        lane = self.resources.lane
        if self.on_lane(destination) and lane is not None and graph is None:
            return await run_on_lane(
                lane, self.resources.files, account, destination, input, input_json, deadline
            )
        output: Any = None
        async for item in self.durable.follow(
            account, destination, input, input_json, deadline, False, graph
        ):
            output = item
        return output

    def on_lane(self, destination: Destination) -> bool:
        """Whether ``destination`` runs through the lane here."""
        return destination.synchronous and self.resources.lane is not None
