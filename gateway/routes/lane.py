"""A synchronous block's task through the ``/run`` lane: permits, runner choice and retries as
``/run`` has them, and no durable write before the answer (the run is recorded after it).
The lane's refusals become the gateway's statuses."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from blocks.graphs.schemas import block_of
from catalog.records import AccountInfo
from files.data_urls import DataUrls
from files.service import Files
from front import lanes
from front.destinations import Destination
from gateway.errors import Aborted, Cancelled, ResourceExhausted, Unavailable
from lane.errors import LaneNotRunning, OutOfCapacity, RunFailed, RunnerUnavailable
from lane.events import RejectReason
from lane.request import Finished, RunRequest
from lane.service import Lane
from tracker.input_checks import canonical_input
from tracker.priority import Priority
from tracker.states import Status


async def _never() -> None:
    """The lane's "client left" signal: the call's own cancellation stands for it here."""
    await asyncio.Event().wait()


async def run_on_lane(
    lane: Lane,
    files: Files,
    account: AccountInfo,
    destination: Destination,
    input: dict[str, Any],
    input_json: bytes,
    deadline: float | None,
) -> Any:
    """The block's output for ``input``, run through ``lane``."""
    block = block_of(destination)
    linked, errors = await files.input_links(account.id, input)
    runner_input_json = None
    if linked is not input and not errors:
        runner_input_json = canonical_input(linked)
    try:
        result = await lane.run(
            RunRequest(
                placement=lanes.placement(lane, destination),
                account_id=account.id,
                priority=Priority.NORMAL,
                input_json=input_json,
                stream=False,
                left=_never,
                cancel_after=None if deadline is None else max(0.0, deadline - time.monotonic()),
                runner_input_json=runner_input_json,
                output_files=DataUrls(files, files.settings.inline_max),
            )
        )
    except OutOfCapacity as refused:
        if refused.reason is RejectReason.NO_RUNNER:
            raise Unavailable(f"no runner serves block {block.id} now", "block_id") from None
        raise ResourceExhausted(
            f"block {block.id} is at capacity ({refused.reason.value}); retry in "
            f"{refused.retry_after_s:g} s"
        ) from None
    except RunnerUnavailable:
        raise Unavailable(
            f"block {block.id}'s runners refused this server's runner token"
            " (CONDUIT_RUNNER_TOKEN differs): out of service until one answers again"
        ) from None
    except RunFailed as failed:
        raise Unavailable(f"block {block.id}'s runners failed: {failed.detail}") from None
    except LaneNotRunning:
        raise Unavailable("this gateway runs no lane") from None
    if not isinstance(result, Finished):
        raise Cancelled("the call ended before its answer")
    body = result.body
    status = body.get("status")
    if status == Status.SUCCEEDED:
        return body.get("output")
    if status == Status.CANCELED:
        raise Cancelled(f"block {block.id}'s run was canceled")
    raise Aborted(f"block {block.id} failed: {body.get('error') or status}")
