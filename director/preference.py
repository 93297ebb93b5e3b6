"""Which deployment's entries a director serving several deployments on one pool host reads
first (Replicate's PreferSameStream): those whose model is loaded, so a read rarely makes the
pool load a model, evict another, and load it back. An aging bound keeps that from starving a
model that is not loaded: a deployment whose oldest waiting entry has waited past it is read
first of all, oldest first, whether its model is loaded or not.

Pure: the director's shell (``director.read_order``) gathers the inputs and reads the streams
in the order this returns. Every deployment is in the order, so the read is work-conserving: a
deployment further down is read whenever those before it leave room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """What is known of one deployment's queue when the order is picked."""

    #: Its model is loaded (READY) on the pool host.
    ready: bool
    #: Seconds its oldest entry not yet read has waited; None when none waits.
    oldest_wait: float | None
    #: Entries waiting to be read.
    backlog: int


#: The tiers, read in this order.
AGED, READY, COLD, IDLE = range(4)


def tier(queue: Waiting, aging_bound: float) -> int:
    """AGED: waited past the bound; READY or COLD: waits, by its model; IDLE: nothing waits."""
    if queue.backlog <= 0:
        return IDLE
    if (queue.oldest_wait or 0.0) > aging_bound:
        return AGED
    return READY if queue.ready else COLD


def read_order(queues: Sequence[Waiting], aging_bound: float) -> list[int]:
    """The indexes of ``queues`` in the order to read them: aged ones, then those whose model
    is ready, then cold ones, each tier oldest first (ties: the order given); deployments with
    nothing waiting last, in the order given (entries may have come since it was known)."""

    def key(index: int) -> tuple[int, float, int]:
        queue = queues[index]
        level = tier(queue, aging_bound)
        age = 0.0 if level == IDLE else (queue.oldest_wait or 0.0)
        return (level, -age, index)

    return sorted(range(len(queues)), key=key)
