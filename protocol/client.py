"""The one runner client: Cog's protocol, caller side, over one pooled aiohttp session.

The director starts, follows and cancels predictions with it (:meth:`RunnerClient.start`,
:meth:`~RunnerClient.attach`, :meth:`~RunnerClient.cancel`) and watches its runner
(:meth:`~RunnerClient.health_check`, :meth:`~RunnerClient.capabilities`); the synchronous lane
calls runners with :meth:`~RunnerClient.run`. Every answer is read by the one table,
:func:`protocol.answers.read`: a start raises what :mod:`protocol.errors` says for a verdict
other than ``accepted``; a synchronous call returns its :class:`RunAnswer`, verdict and all.

The session under every call, and the runner token each carries, are
:mod:`protocol.session`'s; the watching reads, :mod:`protocol.probes`'; what the calls return,
:mod:`protocol.outcomes`'.

Each start carries the time the prediction has left (``X-Conduit-Deadline``), which a model pool
host holds its queue, load and run to; a single Conduit runner and a stock Cog server do not
read it. A pool answers how long it held the start (``X-Conduit-Load-Time``,
``X-Conduit-Queue-Wait``): :attr:`Accepted.times`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from core.unreachable import UNREACHABLE
from protocol.answers import Verdict, read, unreachable
from protocol.documents import PredictionRequest
from protocol.errors import NoAnswer, NotRunning, RunnerError, error_for
from protocol.feed import SnapshotFeed
from protocol.headers import (
    ACCEPT,
    ATTACH,
    CONTENT_TYPE,
    DEADLINE,
    IF_MATCH,
    JSON,
    LOAD_TIME,
    NDJSON,
    POOL_QUEUE_WAIT,
    PREFER,
    PRIORITY,
    RESPOND_ASYNC,
    TENANT_ID,
)
from protocol.outcomes import Accepted, RunAnswer, finished
from protocol.paths import (
    CANCEL_PATH,
    PREDICTION_PATH,
    PREDICTIONS_PATH,
    TRAINING_CANCEL_PATH,
    TRAINING_PATH,
)
from protocol.probes import RunnerProbes
from protocol.timings import RunnerTimes, RunnerTiming
from protocol.values import Priority

__all__ = ["START_ANSWER_TIMEOUT", "RunnerClient"]

#: A snapshot stream lasts as long as its prediction: only connecting is bounded here.
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None)
#: How long a start may take to be answered (accepted, refused, or its stream begun).
START_ANSWER_TIMEOUT = 30.0
#: A synchronous call lasts as long as its model takes (its caller ends it when its own client
#: leaves): only connecting is bounded.
_RUN_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None)


class RunnerClient(RunnerProbes):
    """Cog's protocol, caller side, to one runner: starts, attaches, synchronous calls and
    cancels; the health and capability reads are :class:`~protocol.probes.RunnerProbes`'."""

    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        token: str | None = None,
        *,
        trainings: bool = False,
    ) -> None:
        """``trainings``: start and cancel on Cog's ``/trainings`` endpoints (a trainer)
        rather than ``/predictions``; the protocol is the same."""
        super().__init__(base_url, session, token)
        self._one_path = TRAINING_PATH if trainings else PREDICTION_PATH
        self._cancel_path = TRAINING_CANCEL_PATH if trainings else CANCEL_PATH

    async def start(
        self,
        prediction_id: str,
        input: dict[str, Any],
        webhook: str,
        tenant: str | None = None,
        priority: str = Priority.NORMAL,
        deadline: float | None = None,
        output_file_prefix: str | None = None,
    ) -> Accepted:
        """``PUT /predictions/<id>`` with ``Prefer: respond-async``; returns once accepted.

        It also asks for the snapshot stream (``Accept: application/x-ndjson``): a Conduit
        runner answers with it, and the returned feed carries the snapshots that would
        otherwise come as webhooks; a stock Cog server ignores the header, answers 202, and
        the feed is None: its webhooks say what happens. Either way the webhook stays in the
        body, as the runner's fallback when a stream breaks off.

        Accepted may mean queued inside the runner: its ``start`` snapshot says when it runs.
        ``X-Tenant-ID`` and ``X-Priority`` tell a Conduit runner whose work it is and how urgent
        (a stock Cog server ignores them). ``deadline`` is the seconds the prediction has left
        (``X-Conduit-Deadline``). Raises what :func:`protocol.errors.error_for` makes of any
        other verdict: a ``RunnerRefused`` when it will not take the prediction now,
        ``OutOfTime`` or ``CannotServe`` when a model pool cannot run it.
        ``output_file_prefix``: where the runner PUTs the prediction's output files.
        """
        extra = {} if deadline is None else {DEADLINE: f"{max(0.0, deadline):.3f}"}
        return await self._put(
            prediction_id, input, webhook, tenant, priority, extra, output_file_prefix
        )

    async def attach(
        self,
        prediction_id: str,
        input: dict[str, Any],
        webhook: str,
        tenant: str | None = None,
        priority: str = Priority.NORMAL,
        output_file_prefix: str | None = None,
    ) -> SnapshotFeed | None:
        """Follow a run a Conduit runner is still running (its director died): the same
        ``PUT`` with ``If-Match: *``, which starts nothing. The feed of its snapshots, the
        state so far first; None when the runner is not running it (412).

        Only for Conduit runners: a stock Cog server ignores ``If-Match`` and would start a
        second run.
        """
        try:
            accepted = await self._put(
                prediction_id,
                input,
                webhook,
                tenant,
                priority,
                {IF_MATCH: ATTACH},
                output_file_prefix,
            )
            return accepted.feed
        except NotRunning:
            return None

    async def _put(
        self,
        prediction_id: str,
        input: dict[str, Any],
        webhook: str,
        tenant: str | None,
        priority: str,
        extra_headers: dict[str, str],
        output_file_prefix: str | None = None,
    ) -> Accepted:
        headers = {
            PREFER: RESPOND_ASYNC,
            ACCEPT: f"{NDJSON}, {JSON}",
            PRIORITY: priority,
            **extra_headers,
            **self.auth,
        }
        if tenant is not None:
            headers[TENANT_ID] = tenant
        # Every webhook event (the default): the director decides what reaches the client.
        request = PredictionRequest(
            id=prediction_id, input=input, webhook=webhook, output_file_prefix=output_file_prefix
        )
        left_out = {"context"} if output_file_prefix else {"context", "output_file_prefix"}
        body = request.model_dump(mode="json", exclude=left_out)
        url = self.base_url + self._one_path.format(id=prediction_id)
        try:
            async with asyncio.timeout(START_ANSWER_TIMEOUT):
                response = await self.session.put(
                    url, json=body, headers=headers, timeout=_STREAM_TIMEOUT, allow_redirects=False
                )
                times = RunnerTimes.from_start(
                    response.headers.get(LOAD_TIME),
                    response.headers.get(POOL_QUEUE_WAIT),
                )
                if response.status == 200 and response.content_type == NDJSON:
                    return Accepted(SnapshotFeed(response), times)
                try:
                    text = await response.text()
                finally:
                    response.release()
        except aiohttp.ClientConnectorError as error:  # refused: the request went nowhere
            raise RunnerError(f"runner unreachable: {error!r}") from error
        except UNREACHABLE as error:
            raise NoAnswer(f"runner broke off: {error!r}") from error
        reading = read(response.status, response.headers, text)
        if reading.verdict is Verdict.ACCEPTED:
            return Accepted(None, times)
        raise error_for(reading, text)

    async def run(
        self, prediction_id: str, input: Any, *, tenant: str, priority: str, stream: bool
    ) -> RunAnswer:
        """Cog's synchronous ``POST /predictions``: the runner answers when the prediction is
        over, with the prediction; with ``stream``, ``Accept: application/x-ndjson`` asks a
        Conduit runner for its snapshots instead (a stock Cog server ignores the header and
        answers the finished prediction, which is then the only snapshot). ``input`` may be an
        ``orjson.Fragment``. Never raises for what the runner answers (or fails to): the
        answer's verdict says it. A returned ``feed`` must be closed by the caller."""
        headers = {
            CONTENT_TYPE: JSON,
            ACCEPT: f"{NDJSON}, {JSON}" if stream else JSON,
            TENANT_ID: tenant,
            PRIORITY: priority,
            **self.auth,
        }
        body = orjson.dumps({"id": prediction_id, "input": input})
        try:
            response = await self.session.post(
                self.base_url + PREDICTIONS_PATH,
                data=body,
                headers=headers,
                timeout=_RUN_TIMEOUT,
                allow_redirects=False,
            )
        except UNREACHABLE as error:
            return RunAnswer(unreachable(f"runner unreachable: {error!r}"))
        timing = RunnerTiming.from_headers(response.headers)
        if response.status == 200 and response.content_type == NDJSON:
            return RunAnswer(
                read(200, response.headers, ""), feed=SnapshotFeed(response), timing=timing
            )
        try:
            text = await response.text()
        except UNREACHABLE as error:
            return RunAnswer(unreachable(f"runner answer broken off: {error!r}"))
        finally:
            response.release()
        reading = read(response.status, response.headers, text)
        if reading.verdict is not Verdict.ACCEPTED:
            return RunAnswer(reading, timing=timing, text=text)
        return finished(reading, text, timing)

    async def cancel(self, prediction_id: str) -> bool:
        """True when the runner knew the prediction (200); False for 404."""
        url = self.base_url + self._cancel_path.format(id=prediction_id)
        try:
            async with self.session.post(url, headers=self.auth, allow_redirects=False) as response:
                text = await response.text()
        except UNREACHABLE as error:
            raise RunnerError(f"runner unreachable: {error!r}") from error
        reading = read(response.status, response.headers, text)
        if reading.verdict is Verdict.UNAUTHORIZED:
            raise error_for(reading, text)
        return response.status == 200
