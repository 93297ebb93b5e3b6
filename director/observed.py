"""How long this director has seen a run take: the bound of the times its runner may report.

The times a runner reports are recorded (and billed) only as far as this director saw the run
take (``RunnerTimes.within``): from its first offer of the prediction to the runner (for a run
it follows after a restart, from the start an earlier attempt recorded) to the snapshot that
ends it, on its own clock.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import Any

from protocol.timings import RunnerTimes

log = logging.getLogger(__name__)


class Observed:
    def __init__(self, prediction_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.prediction_id = prediction_id
        self._loop = loop
        #: When this director first offered it to the runner (loop time): no run the runner
        #: reports can have begun before.
        self.since: float | None = None

    def offered(self) -> None:
        """An offer to the runner: the first one starts the clock."""
        if self.since is None:
            self.since = self._loop.time()

    def resumed(self, started_at: Any, now: float) -> None:
        """A run followed after a restart, taken over at ``now`` (loop time): seen since the
        start an earlier attempt recorded (``started_at``, the database's clock, read on this
        director's wall clock; skew between the two moves the bound by as much)."""
        ran = 0.0
        if isinstance(started_at, datetime):
            ran = max(0.0, (datetime.now(UTC) - started_at).total_seconds())
        self.since = now - ran

    def bound(self, reported: RunnerTimes) -> RunnerTimes:
        """``reported`` bounded by the time this director saw the run take."""
        observed = 0.0 if self.since is None else self._loop.time() - self.since
        times = reported.within(observed)
        if times != reported:
            log.warning(
                "runner reported %s for %s, more than the %.3fs it was seen running: recorded %s",
                reported.public_metrics(),
                self.prediction_id,
                observed,
                times.public_metrics(),
            )
        return times
