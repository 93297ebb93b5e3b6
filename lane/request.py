"""What a caller hands the lane for one ``/run``, and what the lane hands back.

The caller (the api's ``/run`` routes, a gateway's synchronous block) authenticates, then
resolves and admits the request through the front door (:mod:`front`); the lane never sees
HTTP. It answers a :data:`RunResult`, or raises one of
:mod:`lane.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from files.data_urls import DataUrls
from protocol.values import Priority

#: ``(event, data, id)``: one event of a streamed run (the prediction stream's names).
StreamEvent = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Placement:
    """Which lane a run goes to (``lane``: the lane's name, a deployment) and what it is
    recorded under (the caller resolved its :class:`front.destinations.Destination`)."""

    lane: str
    model: str
    version_id: str
    target: str
    deployment_id: int | None = None
    deployment: str | None = None


@dataclass(frozen=True, slots=True)
class RunRequest:
    """One ``/run``, authenticated and validated."""

    placement: Placement
    account_id: int
    priority: Priority
    """Already honoured: what the account may ask for on this destination."""
    input_json: bytes
    """The input, as canonical JSON: what the run is recorded with."""
    stream: bool
    """Answer the run's events as they happen rather than the finished run."""
    left: Callable[[], Awaitable[object]]
    """Returns once the client has gone (waited on only while a wait may be long)."""
    cancel_after: float | None = None
    """Seconds the client gives the run to be dispatched (``Cancel-After``)."""
    request_id: str | None = None
    runner_input_json: bytes | None = None
    """The input as the runner gets it, when it differs from ``input_json`` (each file
    reference a signed delivery URL)."""
    output_files: DataUrls | None = None
    """Where the run's large data URLs go (none moved without it)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The finished run (``{"id", "status", "output", "error", "metrics"}``) and its headers."""

    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Streamed:
    """The run's events as they happen; the permit is held until ``events`` ends (or is
    closed)."""

    events: AsyncGenerator[StreamEvent, None]
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Left:
    """The client left before the answer: nobody reads it."""


RunResult = Finished | Streamed | Left
