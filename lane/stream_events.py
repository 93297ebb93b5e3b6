"""A runner's cumulative snapshots as the prediction stream's events (``output``, ``logs``,
``error``, ``done``: the names and data of ``GET /v1/predictions/<id>/stream``).

Each snapshot carries everything so far; only what is new becomes events: output chunks past
those already sent (an iterator's output is a growing list), log lines past the text already
sent. An output that is not a list is sent once, with the final snapshot. Event ids are
``0-1``, ``0-2``, …: a ``/run`` stream is not stored, so there is nothing to resume from.
"""

from __future__ import annotations

from typing import Any

import orjson

from protocol.documents import PredictionResponse
from tracker.events import done_data, output_text


class SnapshotEvents:
    def __init__(self) -> None:
        self._outputs = 0
        self._logs = 0
        self._count = 0
        #: The latest snapshot seen.
        self.last: PredictionResponse | None = None

    def _event(self, kind: str, data: str) -> tuple[str, str, str]:
        self._count += 1
        return kind, data, f"0-{self._count}"

    def take(self, snapshot: PredictionResponse) -> list[tuple[str, str, str]]:
        """``(event, data, id)`` for what ``snapshot`` adds."""
        self.last = snapshot
        events: list[tuple[str, str, str]] = []
        output: Any = snapshot.output
        if isinstance(output, list) and len(output) > self._outputs:
            events += [self._event("output", output_text(c)) for c in output[self._outputs :]]
            self._outputs = len(output)
        elif output is not None and not isinstance(output, list) and snapshot.status.is_terminal:
            if not self._outputs:
                events.append(self._event("output", output_text(output)))
                self._outputs = 1
        if len(snapshot.logs) > self._logs:
            new = snapshot.logs[self._logs :]
            self._logs = len(snapshot.logs)
            events += [self._event("logs", line) for line in new.splitlines()]
        return events

    def end(self, status: str, error: str | None) -> list[tuple[str, str, str]]:
        """The closing events: ``error`` when there is one, then ``done``."""
        events = []
        if error:
            events.append(self._event("error", orjson.dumps({"detail": error}).decode()))
        events.append(self._event("done", done_data(status)))
        return events
