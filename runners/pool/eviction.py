"""Eviction planning: which READY slots to unload so a load fits, and what a load that ran out
of memory or came out larger than its lease must unload.

Candidates are ordered by priority class (lowest first), then by the policy: least recently
used, or lowest cost (load-time EWMA × recent requests) per byte freed. Victims are taken in
that order until enough is freed, then any victim whose removal still leaves enough is put
back (latest taken first): the set is minimal, never "evict everything older".

:class:`Evictions` only plans: the core carries out the unloads it names.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runners.pool.config import ModelSpec, Policy, PoolConfig
from runners.pool.leases import MemoryLedger
from runners.pool.slots import Slot, SlotState
from runners.pool.stats import PoolStats


@dataclass(frozen=True, slots=True)
class Candidate:
    model: str
    bytes_freed: int
    """On the device being planned."""
    priority: int
    last_used: float
    cost: float
    """Load-time EWMA × requests in the recent window: what evicting it will cost again."""
    evictable_now: bool
    """Idle and resident ≥ ``min_resident``; otherwise it must be waited for."""


def _key(policy: Policy, c: Candidate) -> tuple[object, ...]:
    if policy is Policy.COST:
        return (not c.evictable_now, c.priority, c.cost / max(c.bytes_freed, 1), c.last_used)
    return (not c.evictable_now, c.priority, c.last_used, c.model)


def choose(candidates: Iterable[Candidate], deficit: int, policy: Policy) -> list[Candidate]:
    """A minimal victim set freeing ≥ ``deficit`` bytes, preferring candidates evictable now;
    empty when ``deficit`` ≤ 0; raises ``LookupError`` when all of them would not free enough."""
    if deficit <= 0:
        return []
    taken: list[Candidate] = []
    freed = 0
    for candidate in sorted(candidates, key=lambda c: _key(policy, c)):
        if freed >= deficit:
            break
        taken.append(candidate)
        freed += candidate.bytes_freed
    if freed < deficit:
        raise LookupError(deficit - freed)
    for candidate in reversed(list(taken)):
        if freed - candidate.bytes_freed >= deficit:
            taken.remove(candidate)
            freed -= candidate.bytes_freed
    return taken


class Fit(enum.Enum):
    """How a load that just ended fits the budget at the size it was observed at."""

    FITS = "fits"
    """Within every device's budget, once the named victims are unloaded."""
    TOO_LARGE = "too_large"
    """Over a device's ceiling: it can never fit there."""
    RELOAD = "reload"
    """Over the budget and no idle victim frees enough: unload it, to reload at its size."""


@dataclass(frozen=True, slots=True)
class Reconciled:
    fit: Fit
    victims: tuple[str, ...] = ()


class Evictions:
    """Plans over the core's slots (read, never changed here)."""

    def __init__(
        self,
        config: PoolConfig,
        specs: Mapping[str, ModelSpec],
        slots: Mapping[str, Slot],
        ledger: MemoryLedger,
        stats: PoolStats,
    ) -> None:
        self._config = config
        self._specs = specs
        self._slots = slots
        self._ledger = ledger
        self._stats = stats

    def candidates(self, device: int, model: str, now: float) -> list[Candidate]:
        """READY, unpinned slots on ``device`` other than ``model``; idle and resident for
        ``min_resident`` ones are evictable now, the others only after waiting."""
        return [
            Candidate(
                model=s.model,
                bytes_freed=s.lease_bytes,
                priority=self._specs[s.model].priority,
                last_used=s.last_used,
                cost=s.load_ewma * self._stats.recent_requests(s.model, now),
                evictable_now=s.in_flight == 0
                and s.resident_since(now) >= self._config.min_resident,
            )
            for s in self._slots.values()
            if s.model != model
            and not s.pinned
            and s.state is SlotState.READY
            and device in s.devices
        ]

    def stopping_bytes(self, device: int) -> int:
        """Bytes on ``device`` that unloads under way will free."""
        return sum(
            s.lease_bytes
            for s in self._slots.values()
            if s.state is SlotState.STOPPING and device in s.devices
        )

    def idle_victims(self, model: str, devices: tuple[int, ...], now: float) -> list[str]:
        """Before the one retry of ``model``'s load that ran out of memory: every slot on its
        devices that may be evicted now, in name order."""
        return sorted(
            {
                c.model
                for device in devices
                for c in self.candidates(device, model, now)
                if c.evictable_now
            }
        )

    def reconcile(self, slot: Slot, now: float) -> Reconciled:
        """After a load, with its lease now what was observed: over a device's ceiling it can
        never fit; over the budget, idle victims make up the excess, else it is reloaded."""
        ledger = self._ledger
        if any(ledger.ceiling(d, slot.model) < slot.lease_bytes for d in slot.devices):
            return Reconciled(Fit.TOO_LARGE)
        victims: dict[str, None] = {}
        for device in slot.devices:
            excess = -ledger.free_for(device, slot.model) - self.stopping_bytes(device)
            idle = [c for c in self.candidates(device, slot.model, now) if c.evictable_now]
            try:
                chosen = choose(idle, excess, self._config.policy)
            except LookupError:
                return Reconciled(Fit.RELOAD)
            victims.update(dict.fromkeys(c.model for c in chosen))
        return Reconciled(Fit.FITS, tuple(victims))
