"""What the pool core consumes (events) and what it asks the host process to do (effects).

Every event carries ``now``: the host's monotonic clock in seconds; every time the core hands
back (``ArmTimer.at``, ``Request.deadline``, ``SlotView.expires_at``) is on that same clock. The
core never reads a clock itself, so tests and the simulator drive it with plain numbers.

Races the host cannot order are tolerated, and only those: a ``Cancel`` or ``ServeDone`` for a
request the core no longer tracks, and a ``LoadDone``/``LoadFailed`` for a model the core has
asked to unload (``StartUnload`` of a load past its deadline) are ignored. Anything else that
does not fit the slot's state (``LoadDone`` for an idle slot, ``UnloadDone`` for a ready one)
raises :class:`~runners.pool.slots.IllegalTransition`: it is a bug in the host.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from core.shell import ArmTimer, Tick


class RejectCode(enum.StrEnum):
    MODEL_TOO_LARGE = "model_too_large"
    """Its lease can never fit the budget (of ``tensor_parallel`` devices); final."""
    DEADLINE_UNMEETABLE = "deadline_unmeetable"
    """Before a load: time left < the model's load EWMA + run p50."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """The deadline passed while the request waited (queue, eviction or load)."""
    QUEUE_FULL = "queue_full"
    LOAD_FAILED = "load_failed"
    """The load this request waited for failed or passed the model's load deadline."""
    COOLDOWN = "cooldown"
    """The model's last load failed; it is not retried before ``retry_after``."""
    UNKNOWN_MODEL = "unknown_model"


# --- events -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A prediction for ``model`` asking for one of its permits."""

    request_id: str
    model: str
    deadline: float | None
    """Absolute, on the event clock; covers queue + load + run. None: no deadline."""
    now: float
    priority: int = 0
    """Higher is served first."""
    keep_alive: float | None = None
    """Seconds (the request's keep-alive header): 0 unloads after the last request, negative
    keeps the model as long as the cap allows; capped at ``PoolConfig.keep_alive_cap``. None:
    the model's, else the pool's default."""


@dataclass(frozen=True, slots=True)
class Cancel:
    """The caller went away. A queued request leaves the queue silently (no effect: nobody is
    listening); a granted one keeps its permit until its ``ServeDone``; a load it waited for
    keeps running for the others (and, orphaned, completes and then obeys its keep-alive)."""

    request_id: str
    now: float


@dataclass(frozen=True, slots=True)
class LoadDone:
    model: str
    observed_bytes: int
    """Peak memory the model took, over all its devices (split evenly between them)."""
    now: float


@dataclass(frozen=True, slots=True)
class LoadFailed:
    model: str
    error: str
    now: float
    out_of_memory: bool = False
    """It ran out of device memory (CUDA OOM and the like): retried once, after evicting."""


@dataclass(frozen=True, slots=True)
class UnloadDone:
    """The backend stopped and its memory is free. Exactly one per ``StartUnload``."""

    model: str
    now: float


@dataclass(frozen=True, slots=True)
class ServeDone:
    """The granted request finished (answered, failed, or aborted): its permit is free."""

    request_id: str
    now: float


@dataclass(frozen=True, slots=True)
class Start:
    """Sent once, first: loads the pinned models."""

    now: float


@dataclass(frozen=True, slots=True)
class AdminLoad:
    """``POST /v1/models/load``: load ``model`` (queued like a request with no deadline), after
    unloading ``evict`` (when it is busy: once it drains, with no new grants meanwhile).
    Answered by ``AdminDone(op_id)`` when the model is READY or the load failed."""

    op_id: str
    model: str
    now: float
    evict: str | None = None


@dataclass(frozen=True, slots=True)
class AdminUnload:
    """``POST /v1/models/unload``: unload ``model`` once its in-flight requests finish (no new
    grants meanwhile). ``AdminDone(op_id)`` when its memory is free (at once when idle)."""

    op_id: str
    model: str
    now: float


@dataclass(frozen=True, slots=True)
class Pin:
    """Pin (never evicted nor idle-unloaded) or unpin ``model``; ``AdminDone(op_id)`` at once,
    with ``error="pins_exceed_budget"`` when the pins would no longer fit."""

    op_id: str
    model: str
    pinned: bool
    now: float


Event = (
    Request
    | Cancel
    | LoadDone
    | LoadFailed
    | UnloadDone
    | ServeDone
    | Tick
    | Start
    | AdminLoad
    | AdminUnload
    | Pin
)


# --- effects ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartLoad:
    """Start the model's backend on ``devices``; answer ``LoadDone`` or ``LoadFailed``."""

    model: str
    lease_bytes: int
    """Per device: the memory the core accounts for the model on each of ``devices``."""
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartUnload:
    """Stop the model's backend (also when it is still loading); answer ``UnloadDone``."""

    model: str
    reason: str
    """``ttl``, ``evicted:lru``, ``evicted:cost``, ``evicted:reconcile``, ``admin``,
    ``oom-retry`` (its observed size did not fit: it reloads with that size),
    ``evicted:oom-retry`` (room for the retry of a load that ran out of memory), ``too_large``,
    ``load_timeout``."""


@dataclass(frozen=True, slots=True)
class Grant:
    """Serve the request on ``model`` now; its permit is held until ``ServeDone``."""

    request_id: str
    model: str
    waited_s: float
    """Seconds from the request to this grant (queue, evictions and load)."""
    load_s: float = 0.0
    """The part of ``waited_s`` spent before the model was ready: the cold start (evictions
    and the load) the request sat through; 0 when the model was ready when it arrived."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer the request with an error (503 + ``Retry-After`` when ``retry_after`` is set);
    final."""

    request_id: str
    code: RejectCode
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class AdminDone:
    """The admin operation ``op_id`` finished; ``error`` is None on success."""

    op_id: str
    model: str
    error: str | None = None


Effect = StartLoad | StartUnload | Grant | Refuse | AdminDone | ArmTimer
