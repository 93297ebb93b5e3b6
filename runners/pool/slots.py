"""One model's slot: its state machine and the bookkeeping the scheduler reads."""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field


class SlotState(enum.StrEnum):
    IDLE = "idle"
    LOADING = "loading"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"
    """Its last load failed; no load before ``Slot.cooldown_until``."""


_ALLOWED: frozenset[tuple[SlotState, SlotState]] = frozenset(
    {
        (SlotState.IDLE, SlotState.LOADING),
        (SlotState.LOADING, SlotState.READY),
        (SlotState.LOADING, SlotState.FAILED),
        (SlotState.LOADING, SlotState.STOPPING),  # past its load deadline
        (SlotState.LOADING, SlotState.IDLE),  # out of memory: retried once, after evicting
        (SlotState.READY, SlotState.STOPPING),
        (SlotState.STOPPING, SlotState.IDLE),
        (SlotState.STOPPING, SlotState.FAILED),  # the stop of a load past its deadline
        (SlotState.FAILED, SlotState.IDLE),  # cooldown over
    }
)


class IllegalTransition(RuntimeError):
    def __init__(self, model: str, source: SlotState, target: SlotState) -> None:
        super().__init__(f"slot {model!r}: {source} -> {target} is not a transition")
        self.model = model
        self.source = source
        self.target = target


@dataclass(frozen=True, slots=True)
class Transition:
    state: SlotState
    reason: str
    at: float


@dataclass(slots=True)
class Slot:
    model: str
    pinned: bool
    load_ewma: float
    state: SlotState = SlotState.IDLE
    devices: tuple[int, ...] = ()
    lease_bytes: int = 0
    """Per device, while LOADING, READY or STOPPING."""
    observed_bytes: int | None = None
    """Total over its devices, from the last ``LoadDone``."""
    peak_bytes: int = 0
    in_flight: int = 0
    load_started: float = 0.0
    ready_at: float = 0.0
    last_used: float = 0.0
    expires_at: float | None = None
    keep_alive: float | None = None
    """Seconds, from the last granted request (None: never idle-unload)."""
    failures: int = 0
    loads: int = 0
    """Completed loads, for the load-time EWMA (the configured guess until the first)."""
    cooldown_until: float = 0.0
    fail_after_stop: bool = False
    draining: bool = False
    """An admin unload (or admin evict) waits for it: no new grants."""
    oom_retry: bool = False
    """Its last load ran out of memory: the next one first unloads every idle victim on its
    devices, and is the last try."""
    oom_retried: bool = False
    """The load under way is that last try: out of memory again, it fails."""
    load_reason: str = "request"
    last: Transition = field(default_factory=lambda: Transition(SlotState.IDLE, "config", 0.0))
    runs: deque[float] = field(default_factory=lambda: deque(maxlen=50))
    """Recent run durations (grant to ``ServeDone``), for the run p50."""

    def to(self, target: SlotState, reason: str, now: float) -> None:
        if (self.state, target) not in _ALLOWED:
            raise IllegalTransition(self.model, self.state, target)
        self.state = target
        self.last = Transition(target, reason, now)

    def run_p50(self) -> float:
        if not self.runs:
            return 0.0
        ordered = sorted(self.runs)
        return ordered[len(ordered) // 2]

    def resident_since(self, now: float) -> float:
        return now - self.ready_at


@dataclass(frozen=True, slots=True)
class SlotView:
    """One slot as the capabilities list and the metrics show it."""

    model: str
    state: SlotState
    pinned: bool
    devices: tuple[int, ...]
    lease_bytes: int
    """Per device; 0 when the slot holds no memory."""
    observed_bytes: int | None
    in_flight: int
    last_used: float
    expires_at: float | None
    load_ewma: float
    last_state: SlotState
    last_reason: str
    """Why the last transition happened: ``loaded``, ``ttl``, ``evicted:lru``, ``admin``…"""
    last_at: float
    cooldown_until: float | None

    @classmethod
    def of(cls, slot: Slot) -> SlotView:
        return cls(
            model=slot.model,
            state=slot.state,
            pinned=slot.pinned,
            devices=slot.devices,
            lease_bytes=slot.lease_bytes,
            observed_bytes=slot.observed_bytes,
            in_flight=slot.in_flight,
            last_used=slot.last_used,
            expires_at=slot.expires_at,
            load_ewma=slot.load_ewma,
            last_state=slot.last.state,
            last_reason=slot.last.reason,
            last_at=slot.last.at,
            cooldown_until=slot.cooldown_until if slot.state is SlotState.FAILED else None,
        )
