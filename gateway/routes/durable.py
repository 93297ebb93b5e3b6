"""The durable route: a task on a block becomes a prediction on the block's deployment (or
version) stream, the path the api's ``POST /v1/predictions`` takes (stored, then queued by the
front door; claimed by a director, fenced, retried, dead-lettered), and its answer is collected
from its event stream by the process's one reader (:class:`tracker.event_hub.EventHub`), as
``Prefer: wait`` is.

The prediction gets the call's deadline as its own (the director fails it past that), and a
call that ends before its prediction does (canceled by the client, out of time, the gateway
stopping) cancels it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from blocks.graphs.schemas import block_of
from catalog.records import AccountInfo
from front.admission import new_prediction
from front.destinations import Destination
from gateway.errors import ResourceExhausted, Unavailable
from gateway.prediction_end import cancel_prediction, final_state, outcome, wall_deadline
from gateway.resources import GatewayResources
from tracker.events import EventType

#: What ``predictions.source`` says of the predictions the gateway makes.
SOURCE = "gateway"


class DurableRoute:
    def __init__(self, resources: GatewayResources) -> None:
        self.resources = resources

    async def follow(
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
