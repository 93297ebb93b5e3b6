"""The ownership fence an attempt publishes behind.

Postgres fences every state write by attempt number; what an attempt publishes elsewhere (live
events, intermediate webhooks) has no such check, so it asks its fence first. A director's
``Lease`` is the fence of the attempts it runs: lost when a heartbeat finds the queue entry
taken over or a fenced write finds another attempt in charge, and renewed before a publish that
follows a stall (a director paused past its lease must not publish once another has taken over).
"""

from __future__ import annotations

from typing import Protocol


class Fence(Protocol):
    @property
    def lost(self) -> bool:
        """True once this attempt no longer owns its prediction; it never becomes False again."""
        ...

    def revoke(self, why: str) -> None:
        """Record that this attempt lost its prediction (``why`` is for the log)."""
        ...

    async def held(self) -> bool:
        """Whether this attempt may still publish, renewing the hold first when it is stale."""
        ...
