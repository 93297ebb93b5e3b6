"""Victim choice: which READY slots to unload so a load fits on one device.

Candidates are ordered by priority class (lowest first), then by the policy: least recently
used, or lowest cost (load-time EWMA × recent requests) per byte freed. Victims are taken in
that order until enough is freed, then any victim whose removal still leaves enough is put
back (latest taken first): the set is minimal, never "evict everything older".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from runners.pool.config import Policy


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
