"""What the lane core consumes (events) and what it asks the IO shell to do (effects).

Every event carries ``now``: the shell's monotonic clock in seconds (``time.monotonic()`` or
the event loop's ``loop.time()``), and every time the core hands back (``ArmTimer.at``) is on
that same clock. ``Arrive.deadline`` is an absolute time on it too. The core never reads a
clock itself, which is what lets the tests drive it with plain numbers.

Events naming a request the core no longer tracks (a ``Cancel`` racing a ``Reject``, a
``Done`` after the request ended) are ignored: the shell cannot always order them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from core.shell import ArmTimer, Tick
from protocol.values import Priority


class Outcome(enum.StrEnum):
    """How one attempt on a runner ended, as the shell saw it.

    ``failed`` is the *call* failing (connection refused or reset, a 5xx, a broken answer): it
    counts against the runner's health and may be retried elsewhere. A prediction that ran and
    reported its own error is ``ok`` for the lane: the runner answered.
    """

    OK = "ok"
    FAILED = "failed"
    REFUSED = "refused"
    """The runner said it is at capacity (Cog 409, 429, 503); not a health failure."""
    DISCONNECTED = "disconnected"
    """The client went away while the runner worked; ends the request, never retried."""
    UNAUTHORIZED = "unauthorized"
    """The runner refused this server's runner token (401, 403): a misconfiguration, not the
    request's fault. The runner is taken out of service at once (even the last one: it serves
    nothing) and the request may go to another runner."""


class RejectReason(enum.StrEnum):
    OUT_OF_CAPACITY = "out_of_capacity"
    """Queue full, the account's share of it full, or every runner refused."""
    EXPIRED = "expired"
    """Queued past min(deadline, arrival + queue_ttl)."""
    NO_RUNNER = "no_runner"
    """The deployment has no runner in the fleet view."""
    RUNNER_UNAVAILABLE = "runner_unavailable"
    """Every runner of the deployment is out of service for refusing this server's runner token
    (answered 503: the platform's fault, not a capacity limit)."""


def band_of(priority: Priority) -> int:
    """The queue band of an (already honoured) ``X-Priority``: lower bands are served first."""
    return priority.rank


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrive:
    """A ``/run`` request, authenticated and validated, asking for a permit."""

    request_id: str
    deployment: str
    account: str
    priority_band: int
    """Lower is served first (strictly); see :func:`band_of`."""
    deadline: float | None
    """Absolute, on the event clock; None: only ``queue_ttl`` bounds the wait."""
    now: float
    loan: str | None = None
    """A runner one of whose shared permits was borrowed for this arrival (Redis counted it,
    ``lane.loans``): one permit more here until the core gives it back with ``Repay``."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """The client disconnected. A queued request leaves the queue at once and never takes a
    permit. A dispatched one ends now, but its permit is released only by the ``Done`` of the
    attempt in flight: the runner keeps working until the shell's call to it is aborted, and
    handing its slot out earlier would make it refuse the next request."""

    request_id: str
    now: float


@dataclass(frozen=True, slots=True)
class Done:
    """The attempt dispatched to ``runner_id`` finished (response or stream complete, or the
    call failed). Sent exactly once per ``Dispatch``, also after a ``Cancel``."""

    request_id: str
    runner_id: str
    outcome: Outcome
    first_byte_sent: bool
    """True once any byte of the answer reached the client: no retry past that point."""
    now: float
    retry_after: float | None = None
    """Seconds, from the refusal's ``Retry-After``; only read with ``Outcome.REFUSED``."""


@dataclass(frozen=True, slots=True)
class RunnerSlot:
    runner_id: str
    permits: int
    """This replica's share of the runner's advertised concurrency (see :mod:`lane.slices`);
    0 when its permits are shared."""
    shared: int = 0
    """Permits of the runner that every replica borrows through Redis (:mod:`lane.loans`),
    when it has fewer than there are replicas; 0 when they are sliced."""


@dataclass(frozen=True, slots=True)
class RunnersChanged:
    """The deployment's ready runners, in a stable order (the order "first available" uses).

    Sent when the fleet view refreshes (at least every 5 s) and when replica membership
    changes the slices. Replaces the previous list; clears every "full" mark (a refusal holds
    only until the next refresh); ejections survive it. A runner that left keeps its in-flight
    requests until their ``Done``, but gets no new ones.
    """

    deployment: str
    runners: tuple[RunnerSlot, ...]
    now: float


Event = Arrive | Cancel | Done | Tick | RunnersChanged


# --- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Call ``runner_id`` for the request now; a permit is held until the matching ``Done``."""

    request_id: str
    runner_id: str
    attempt: int
    """1 for the first call, 2 for the retry on another runner (``X-Conduit-Attempts``)."""
    waited_s: float
    """Seconds from ``Arrive`` to this dispatch (``X-Queue-Wait-Ms``)."""


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer 429 problem+json ``code: out_of_capacity`` with ``Retry-After`` (503
    ``runner_unavailable`` for :attr:`RejectReason.RUNNER_UNAVAILABLE`); final."""

    request_id: str
    reason: RejectReason
    retry_after_s: int


@dataclass(frozen=True, slots=True)
class Fail:
    """The request failed on its runner(s) and will not be retried; final. Before the first
    byte, an error answer; after it, an ``error`` event on the stream."""

    request_id: str
    error: str
    attempts: int


@dataclass(frozen=True, slots=True)
class Repay:
    """Give a borrowed permit of ``runner_id`` back to the pool in Redis: it is idle here (or
    the runner left)."""

    deployment: str
    runner_id: str


Effect = Dispatch | Reject | Fail | ArmTimer | Repay
