"""Cog's runner protocol, client side, over one pooled aiohttp session.

aiohttp rather than httpx on this path: with many requests in flight httpx 0.28 was measured
an order of magnitude slower (see the design notes), and the director talks to its runner for
every prediction.

With a runner token (``CONDUIT_RUNNER_TOKEN``), every call carries it as ``Authorization:
Bearer``; a stock Cog server ignores the header.

Exception tree::

    RunnerError             the runner is unreachable or broke the protocol (infrastructure)
    ├── RunnerUnauthorized  401/403: the runner refused this director's token (configuration)
    └── RunnerRefused       it answered but will not take the prediction now; retry later
        ├── RunnerBusy          409: every slot in use, and no queue (stock Cog)
        ├── RunnerSaturated     503 + the spec's queue_full error: the runner's queue is full
        ├── RunnerNotReady      503 + Cog body: setup running or failed, model not loaded
        └── RateLimited         429: the tenant's rate limit on this runner
    InputRejected           400/422: the runner refused the input (a prediction failure)
    OutOfTime               422/504 deadline_*: a model pool cannot run it in the time it has

Each start carries the time the prediction has left (``X-Conduit-Deadline``), which a model pool
host holds its queue, load and run to; a single Conduit runner and a stock Cog server do not
read it. A pool answers how long it held the start (``X-Conduit-Load-Time``,
``X-Conduit-Queue-Wait``): :attr:`Accepted.times`.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp
import pydantic
from multidict import CIMultiDictProxy

from runners import protocol as wire
from runners.protocol import (
    CapabilitiesDocument,
    HealthCheck,
    PredictionResponse,
    Priority,
)
from tracker.retry import UNREACHABLE
from tracker.usage import UNKNOWN_HARDWARE, RunnerTimes

log = logging.getLogger(__name__)
#: A snapshot stream lasts as long as its prediction: only connecting is bounded here.
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=5, sock_read=None)
#: How long a start may take to be answered (accepted, refused, or its stream begun).
START_ANSWER_TIMEOUT = 30.0


class RunnerError(Exception):
    """The runner could not be reached or answered in a way the protocol does not allow.

    An infrastructure failure: the prediction is not failed for it; the queue entry stays
    unacknowledged so the prediction is retried.
    """


class RunnerUnauthorized(RunnerError):
    """401 (no or another token) or 403 (an internal call from off loopback to a runner
    without a token): the director and its runner disagree on ``CONDUIT_RUNNER_TOKEN``. An
    infrastructure failure like any other: nothing about the prediction is wrong."""


class RunnerRefused(RunnerError):
    """The runner will not take the prediction now; ``retry_after`` is when it suggests to
    ask again (seconds, from ``Retry-After``), None when it did not say."""

    #: Label of the refusal in metrics.
    reason: ClassVar[str] = "refused"
    #: How the refusal reads in a prediction's error ("runner stayed <state> ...").
    state: ClassVar[str] = "refusing"

    def __init__(self, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


class RunnerBusy(RunnerRefused):
    """409: every prediction slot is in use (a stock Cog server queues nothing)."""

    reason = "busy"
    state = "busy (409 all slots busy)"


class RunnerSaturated(RunnerRefused):
    """503 with the spec's ``queue_full`` error (problem+json from a Conduit runner): the
    runner's queue is full."""

    reason = "saturated"
    state = "saturated (503 queue full)"


class RunnerNotReady(RunnerRefused):
    """503 with Cog's body: setup has not finished (or failed), or no model is loaded."""

    reason = "not_ready"
    state = "not ready (503 setup not finished)"


class RateLimited(RunnerRefused):
    """429: the account (``X-Tenant-ID``) is over its rate limit on this runner."""

    reason = "rate_limited"
    state = "rate limited (429 tenant over its limit)"


class _NotRunning(RunnerError):
    """412 to an attach: the runner is not running the prediction."""


class OutOfTime(Exception):
    """A model pool refused the start for its deadline (``runners.protocol.DeadlineCode``):
    the model's load and run take longer than the time left, or the time ran out while it
    waited for the load. Offering it again cannot help: the prediction ends."""

    def __init__(self, code: wire.DeadlineCode, detail: str) -> None:
        super().__init__(f"{code} ({detail})")
        self.code = code
        self.detail = detail


def _out_of_time(status: int, headers: CIMultiDictProxy[str], text: str) -> OutOfTime | None:
    if status not in (422, 504) or not headers.get(wire.CONTENT_TYPE, "").startswith(
        wire.PROBLEM_JSON
    ):
        return None
    try:
        problem = json.loads(text)
        code = wire.DeadlineCode(problem.get("code"))
    except (ValueError, AttributeError):
        return None
    detail = problem.get("detail")
    return OutOfTime(code, detail if isinstance(detail, str) else text[:500])


class InputRejected(Exception):
    """422: the runner refused the input. A prediction failure, not an infrastructure one."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a runner says about itself (``GET /v1/capabilities``, read through
    :class:`runners.protocol.CapabilitiesDocument`); a stock Cog server says nothing, and is
    ``kind="cog"`` on unknown hardware."""

    kind: str = "cog"
    id: str | None = None
    hardware: str = UNKNOWN_HARDWARE
    #: Predictions it runs at once (Conduit's ``queue.slots``); None when it does not say.
    concurrency: int | None = None

    @classmethod
    def from_json(cls, body: Any) -> Capabilities:
        """A document that does not parse says nothing: a stock Cog server's."""
        try:
            document = CapabilitiesDocument.model_validate(body)
        except pydantic.ValidationError:
            return cls()
        return cls(
            document.runner_type or "conduit",
            document.runner_id,
            _hardware(document),
            _slots(document),
        )


def _slots(document: CapabilitiesDocument) -> int | None:
    slots = (document.queue.model_extra or {}).get("slots")
    return slots if isinstance(slots, int) and not isinstance(slots, bool) and slots > 0 else None


def _hardware(document: CapabilitiesDocument) -> str:
    """Conduit's ``hardware``, else what the spec's ``resources.gpuIds`` imply when the runner
    reported its resources at all."""
    if document.hardware:
        return document.hardware
    if "resources" not in document.model_fields_set:
        return UNKNOWN_HARDWARE
    return "gpu" if document.resources.gpu_ids else "cpu"


STOCK_COG = Capabilities()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delay-seconds or an HTTP-date; None if absent or
    unreadable. A date in the past means "now" (0)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def _refusal(status: int, headers: CIMultiDictProxy[str], text: str) -> RunnerRefused | None:
    retry_after = parse_retry_after(headers.get(wire.RETRY_AFTER))
    if status == 409:
        return RunnerBusy(text, retry_after)
    if status == 429:
        return RateLimited(text, retry_after)
    if status == 503:
        # A full queue answers the spec's error (a Conduit runner's is problem+json too);
        # Cog's "not ready" answers {"error": <message>, "status": "failed"}.
        if headers.get(wire.CONTENT_TYPE, "").startswith(wire.PROBLEM_JSON) or _queue_full(text):
            return RunnerSaturated(text, retry_after)
        return RunnerNotReady(text, retry_after)
    return None


def _queue_full(text: str) -> bool:
    """Whether a body is the runner API spec's ``{"error": {"code": "queue_full", ...}}``."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, dict) and error.get("code") == wire.ErrorCode.QUEUE_FULL


_HINT = "give the director the runner's CONDUIT_RUNNER_TOKEN"


def _check_authorised(status: int, text: str) -> None:
    if status in (401, 403):
        raise RunnerUnauthorized(f"runner answered {status} ({_HINT}): {text[:300]}")


class SnapshotFeed:
    """The snapshots a Conduit runner writes down the response to a start
    (``runners.streaming``): the bodies its webhooks would carry, one JSON document per line.

    Lines are split here rather than by ``StreamReader.readline``, whose line limit is far
    below the size of an output a model may return.
    """

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response

    async def snapshots(self) -> AsyncIterator[PredictionResponse]:
        """Each snapshot as it arrives, until the runner ends the response. A line that does
        not parse is logged and skipped; a broken connection ends the iteration with
        ``aiohttp.ClientError``."""
        buffer = bytearray()
        async for chunk in self._response.content.iter_any():
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if not line.strip():
                    continue
                try:
                    yield PredictionResponse.model_validate_json(line)
                except ValueError as error:
                    log.warning("bad snapshot line from runner: %s", error)

    def close(self) -> None:
        """Give the connection back (or drop it, when the stream did not end)."""
        self._response.release()


@dataclass(frozen=True, slots=True)
class Accepted:
    """A start the runner took."""

    feed: SnapshotFeed | None
    """Its snapshot stream (a Conduit runner's); None: its webhooks say what happens."""
    times: RunnerTimes
    """What a model pool host held it for before passing it on (``load_time``, and its
    ``queue_wait_time``); empty from any other runner."""


class RunnerClient:
    def __init__(
        self, base_url: str, session: aiohttp.ClientSession, token: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        #: Headers on every call: the runner token, when there is one.
        self.auth: dict[str, str] = wire.bearer(token) if token else {}

    async def start(
        self,
        prediction_id: str,
        input: dict[str, Any],
        webhook: str,
        tenant: str | None = None,
        priority: str = Priority.NORMAL,
        deadline: float | None = None,
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
        (``X-Conduit-Deadline``). Raises a ``RunnerRefused`` when it will not take the
        prediction now, ``OutOfTime`` when a model pool cannot run it in that time.
        """
        extra = {} if deadline is None else {wire.DEADLINE: f"{max(0.0, deadline):.3f}"}
        return await self._put(prediction_id, input, webhook, tenant, priority, extra)

    async def attach(
        self,
        prediction_id: str,
        input: dict[str, Any],
        webhook: str,
        tenant: str | None = None,
        priority: str = Priority.NORMAL,
    ) -> SnapshotFeed | None:
        """Follow a run a Conduit runner is still running (its director died): the same
        ``PUT`` with ``If-Match: *``, which starts nothing. The feed of its snapshots, the
        state so far first; None when the runner is not running it (412).

        Only for Conduit runners: a stock Cog server ignores ``If-Match`` and would start a
        second run.
        """
        try:
            accepted = await self._put(
                prediction_id, input, webhook, tenant, priority, {wire.IF_MATCH: wire.ATTACH}
            )
            return accepted.feed
        except RunnerError as error:
            if isinstance(error, _NotRunning):
                return None
            raise

    async def _put(
        self,
        prediction_id: str,
        input: dict[str, Any],
        webhook: str,
        tenant: str | None,
        priority: str,
        extra_headers: dict[str, str],
    ) -> Accepted:
        headers = {
            wire.PREFER: wire.RESPOND_ASYNC,
            wire.ACCEPT: f"{wire.NDJSON}, {wire.JSON}",
            wire.PRIORITY: priority,
            **extra_headers,
            **self.auth,
        }
        if tenant is not None:
            headers[wire.TENANT_ID] = tenant
        # Every webhook event (the default): the director decides what reaches the client.
        request = wire.PredictionRequest(id=prediction_id, input=input, webhook=webhook)
        body = request.model_dump(mode="json", exclude={"context"})
        url = self.base_url + wire.PREDICTION_PATH.format(id=prediction_id)
        try:
            async with asyncio.timeout(START_ANSWER_TIMEOUT):
                response = await self.session.put(
                    url, json=body, headers=headers, timeout=_STREAM_TIMEOUT, allow_redirects=False
                )
                times = RunnerTimes.from_start(
                    response.headers.get(wire.LOAD_TIME),
                    response.headers.get(wire.POOL_QUEUE_WAIT),
                )
                if response.status == 200 and response.content_type == wire.NDJSON:
                    return Accepted(SnapshotFeed(response), times)
                try:
                    if response.status in (200, 201, 202):
                        await response.read()
                        return Accepted(None, times)
                    text = await response.text()
                finally:
                    response.release()
        except UNREACHABLE as error:
            raise RunnerError(f"runner unreachable: {error!r}") from error
        if response.status == 412:
            raise _NotRunning(text[:500])
        _check_authorised(response.status, text)
        refusal = _refusal(response.status, response.headers, text[:500])
        if refusal is not None:
            raise refusal
        if (out_of_time := _out_of_time(response.status, response.headers, text)) is not None:
            raise out_of_time
        if response.status in (400, 422):
            raise InputRejected(text)
        raise RunnerError(f"runner answered {response.status}: {text[:500]}")

    async def cancel(self, prediction_id: str) -> bool:
        """True when the runner knew the prediction (200); False for 404."""
        url = self.base_url + wire.CANCEL_PATH.format(id=prediction_id)
        try:
            async with self.session.post(url, headers=self.auth, allow_redirects=False) as response:
                text = await response.text()
        except UNREACHABLE as error:
            raise RunnerError(f"runner unreachable: {error!r}") from error
        _check_authorised(response.status, text)
        return response.status == 200

    async def health_check(self) -> HealthCheck | None:
        """The runner's ``/health-check`` document; None when it cannot be had."""
        try:
            async with self.session.get(
                f"{self.base_url}{wire.HEALTH_CHECK_PATH}",
                headers=self.auth,
                timeout=aiohttp.ClientTimeout(total=5),
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    return None
                return HealthCheck.model_validate(await response.json())
        except (*UNREACHABLE, ValueError):
            return None

    async def capabilities(self) -> Capabilities | None:
        """``GET /v1/capabilities``. ``STOCK_COG`` when the runner has no such route (404) or
        answers something unreadable; None when it cannot say yet (starting, unreachable)."""
        try:
            async with self.session.get(
                f"{self.base_url}{wire.CAPABILITIES_PATH}",
                headers=self.auth,
                timeout=aiohttp.ClientTimeout(total=5),
                allow_redirects=False,
            ) as response:
                if response.status == 200:
                    try:
                        return Capabilities.from_json(await response.json(content_type=None))
                    except ValueError:
                        return STOCK_COG
                await response.read()
                if response.status in (404, 405):
                    return STOCK_COG
                if response.status in (401, 403):
                    log.warning("runner refused to say what it is (%d): %s", response.status, _HINT)
                return None
        except UNREACHABLE as error:
            log.debug("capabilities not read: %r", error)
            return None
