"""One call of a ``/run`` to a runner, and what the lane makes of its answer.

The call is the one runner client's synchronous ``POST /predictions``
(:meth:`protocol.client.RunnerClient.run`), its answer read by the one status table
(:mod:`protocol.answers`). What the lane needs from it is its :class:`~lane.events.Outcome`,
one per verdict (:data:`OUTCOMES`): a refusal is capacity, not a failure; a runner that cannot
serve the model or its time, an unreachable runner, a 5xx or a broken answer is the call
failing (another runner may take it); a runner refusing this server's token is out of service
(``unauthorized``: the platform's misconfiguration, never the run's failure); anything the
runner ran, and an input it refused, is ``ok``: the runner answered, and the run is over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final

from lane.events import Outcome
from protocol.answers import Verdict
from protocol.client import RunnerClient
from protocol.documents import PredictionResponse
from protocol.feed import SnapshotFeed
from protocol.outcomes import RunAnswer
from protocol.timings import RunnerTiming
from protocol.values import RunnerStatus

log = logging.getLogger(__name__)

#: The lane's outcome of each verdict of the status table (the director's is in
#: :func:`protocol.errors.error_for`).
OUTCOMES: Final[dict[Verdict, Outcome]] = {
    Verdict.ACCEPTED: Outcome.OK,
    Verdict.INPUT_REJECTED: Outcome.OK,
    Verdict.REFUSED: Outcome.REFUSED,
    Verdict.OUT_OF_TIME: Outcome.FAILED,
    Verdict.CANNOT_SERVE: Outcome.FAILED,
    Verdict.UNAUTHORIZED: Outcome.UNAUTHORIZED,
    Verdict.NOT_RUNNING: Outcome.FAILED,
    Verdict.BROKEN: Outcome.FAILED,
    Verdict.UNREACHABLE: Outcome.FAILED,
}


@dataclass(frozen=True, slots=True)
class Answer:
    """How an attempt went. With ``Outcome.OK``, ``prediction`` is the final one (sync), or
    ``feed`` yields the snapshots (streaming, until the runner ends the response)."""

    outcome: Outcome
    prediction: PredictionResponse | None = None
    feed: SnapshotFeed | None = None
    timing: RunnerTiming = field(default_factory=RunnerTiming)
    retry_after: float | None = None
    error: str | None = None


def answer_of(run: RunAnswer) -> Answer:
    """The lane's reading of a runner's answer."""
    reading = run.reading
    outcome = OUTCOMES[reading.verdict]
    if reading.verdict is Verdict.INPUT_REJECTED:
        refused = PredictionResponse(
            id=None, status=RunnerStatus.FAILED, error=f"the runner refused the input: {run.text}"
        )
        return Answer(outcome, prediction=refused, timing=run.timing)
    if outcome is Outcome.OK:
        return Answer(outcome, run.prediction, run.feed, run.timing)
    return Answer(outcome, retry_after=reading.retry_after, error=reading.error)


async def call(
    client: RunnerClient,
    prediction_id: str,
    input: Any,
    *,
    tenant: str,
    priority: str,
    stream: bool,
) -> Answer:
    """``POST /predictions`` for one attempt. ``input`` may be an ``orjson.Fragment``. With
    ``stream``, a returned ``feed`` must be closed by the caller."""
    run = await client.run(prediction_id, input, tenant=tenant, priority=priority, stream=stream)
    return answer_of(run)


async def snapshots(answer: Answer) -> AsyncIterator[PredictionResponse]:
    """An ``ok`` answer's snapshots: the feed's, or the one final prediction."""
    if answer.feed is None:
        if answer.prediction is not None:
            yield answer.prediction
        return
    async for snapshot in answer.feed.snapshots():
        yield snapshot


async def cancel_quietly(client: RunnerClient, prediction_id: str) -> None:
    """Tell the runner to stop a run nobody reads any more (best effort)."""
    try:
        async with asyncio.timeout(5):
            await client.cancel(prediction_id)
    except Exception as error:  # the run ends on its own; nothing else to do
        log.debug("cancel of %s on %s not sent: %r", prediction_id, client.base_url, error)
