"""The director's one way into prediction rows.

A director process builds one :class:`Ledger` over its grouped state writes; nothing in the
director reaches :mod:`tracker.store` or :mod:`tracker.attempt_writes` by itself. Before an
attempt exists, the ledger claims its prediction (and resets a run lost with its director, for a
rerun); from the claim on, the attempt's :class:`tracker.tracker.AttemptTracker`, which the
ledger makes, writes its start, progress and end and reads what it needs back. The heartbeat's
check of which attempt holds a prediction reads through here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import RowMapping

from protocol.capabilities import UNKNOWN_HARDWARE
from tracker import attempt_writes, store
from tracker.batch_writes import StateWrites
from tracker.publishing import Publishing
from tracker.run_output import Caps
from tracker.states import Lifecycle
from tracker.tracker import AttemptTracker


class Ledger:
    def __init__(self, writes: StateWrites) -> None:
        """``writes``: the process's grouped state writes (concurrent attempts share their
        statements)."""
        self.writes = writes
        self.engine = writes.engine

    async def claim(
        self,
        prediction_id: str,
        owner: str,
        takeable: tuple[str, ...] = (),
        version: str | None = None,
    ) -> RowMapping | None:
        """A new attempt at an unfinished prediction, for ``owner``
        (:func:`attempt_writes.claim`)."""
        return await attempt_writes.claim(self.writes, prediction_id, owner, takeable, version)

    async def row(self, prediction_id: str) -> RowMapping | None:
        return await store.get(self.engine, prediction_id)

    async def reset_for_rerun(self, prediction_id: str, attempt: int) -> RowMapping | None:
        """A run lost with its director starts over (:func:`attempt_writes.reset_for_rerun`)."""
        return await attempt_writes.reset_for_rerun(self.engine, prediction_id, attempt)

    def tracker(
        self,
        row: Mapping[Any, Any],
        publishing: Publishing,
        flush_interval: float,
        *,
        hardware: str = UNKNOWN_HARDWARE,
        lifecycle: Lifecycle | None = None,
        caps: Caps | None = None,
    ) -> AttemptTracker:
        """The tracker of the attempt ``row`` was claimed for."""
        return AttemptTracker(
            self.writes,
            row,
            publishing,
            flush_interval,
            hardware=hardware,
            lifecycle=lifecycle,
            caps=caps,
        )
