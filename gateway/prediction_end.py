"""How a gateway prediction ends: the deadline it is given, the status its ending answers the
call with, the final state read back, and the cancel sent when the call ends first."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.errors import Aborted, Cancelled, InvalidArgument
from gateway.resources import GatewayResources
from tracker import store
from tracker.states import Status

log = logging.getLogger(__name__)

#: Seconds a prediction outlives its call's deadline (see :func:`wall_deadline`).
DEADLINE_GRACE = 1.0
#: How the director's error begins when the runner refused a prediction's input.
INPUT_REJECTED = "Invalid input:"


async def final_state(
    engine: AsyncEngine, account_id: int, prediction_id: str, final: str | None
) -> Any:
    """The finished prediction: its final event's, else read back (ABORTED if gone)."""
    if final is not None:
        return orjson.loads(final)
    row = await store.get_for_account(engine, account_id, prediction_id)
    return dict(row) if row is not None else {"status": Status.ABORTED, "error": None}


async def cancel_prediction(
    resources: GatewayResources, account_id: int, prediction_id: str
) -> None:
    """Cancel a prediction whose call ended first; never raises."""
    try:
        row, canceled_now = await store.request_cancel(resources.engine, account_id, prediction_id)
        if row is None:
            return
        if not Status(row["status"]).is_terminal:
            await resources.queue.publish_cancel(prediction_id)
        elif canceled_now:
            await resources.events.finish(prediction_id, row["status"], None)
    except Exception:  # the call is over either way; the deadline still ends it
        log.warning("could not cancel prediction %s", prediction_id, exc_info=True)


def wall_deadline(deadline: float | None) -> datetime | None:
    """The prediction's own deadline: the call's, plus ``DEADLINE_GRACE``. The call ends
    first and cancels the prediction; the prediction's deadline ends it if the gateway died."""
    if deadline is None:
        return None
    left = max(0.0, deadline - time.monotonic()) + DEADLINE_GRACE
    return datetime.now(UTC) + timedelta(seconds=left)


def outcome(block_id: str, prediction: dict[str, Any]) -> Any:
    """The output of a finished prediction, or the status its failure ends the call with."""
    status = prediction.get("status")
    if status == Status.SUCCEEDED:
        return prediction.get("output")
    error = prediction.get("error")
    if status == Status.CANCELED:
        raise Cancelled(f"block {block_id}'s prediction was canceled")
    if isinstance(error, str) and error.startswith(INPUT_REJECTED):
        raise InvalidArgument(f"block {block_id} refused its input: {error}")
    raise Aborted(f"block {block_id} failed: {error or status}")
