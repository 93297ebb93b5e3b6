"""What one run produced so far, kept only as Postgres can store it and Conduit can send it.

NUL characters are escaped (``tracker.render.storable_text``); output or logs past their
:class:`Caps`, or output no escaping makes storable, are not taken: ``refused`` says why, and
the attempt fails the prediction with it. Each ``take_*`` returns the events the new part makes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from tracker.events import EventType, output_text
from tracker.render import Unstorable, storable_json, storable_text

log = logging.getLogger(__name__)

MIB = 1024 * 1024

Events = list[tuple[EventType, str]]


@dataclass(frozen=True, slots=True)
class Caps:
    """Per-prediction limits on what a run may produce, in bytes (output as JSON, logs as
    UTF-8)."""

    output_bytes: int = 64 * MIB
    log_bytes: int = 16 * MIB


class RunOutput:
    """The output and logs taken so far (``logs`` escaped), within ``caps``."""

    def __init__(self, prediction_id: str, caps: Caps) -> None:
        self.prediction_id = prediction_id
        self.caps = caps
        self.output: Any = None
        self.logs = ""
        #: Why this run's output or logs cannot be kept: the prediction fails with it.
        self.refused: str | None = None
        self._output_bytes = 0
        self._log_bytes = 0
        #: Characters of the runner's own log text taken so far (``logs`` holds it escaped).
        self._runner_logs = 0
        self._published_outputs = 0

    def take(self, output: Any, logs: str | None) -> Events:
        """A snapshot's new output chunks and log lines. Snapshots can arrive out of order:
        output shorter than what was taken is older, and adds nothing."""
        events: Events = []
        if isinstance(output, list) and not _shorter(output, self.output):
            events += self.take_chunks(output)
        return events + self.take_logs(logs)

    def take_chunks(self, output: list[Any]) -> Events:
        """Take the chunks not seen yet into ``output``, as they can be stored; nothing when
        they cannot be, or would pass the cap (``refused`` says so)."""
        taken: list[Any] = []
        size = self._output_bytes
        try:
            for chunk in output[self._published_outputs :]:
                value, length = storable_json(chunk)
                taken.append(value)
                size += length + 1
        except Unstorable as error:
            self.refuse(str(error))
            return []
        if not self._output_fits(size):
            return []
        self._output_bytes = size
        self.output = [*(self.output if isinstance(self.output, list) else ()), *taken]
        self._published_outputs = len(self.output)
        return [(EventType.OUTPUT, output_text(chunk)) for chunk in taken]

    def take_logs(self, logs: str | None) -> Events:
        """Take the runner's log text not seen yet (escaped), within the cap."""
        if logs is None or len(logs) <= self._runner_logs:
            return []
        new = storable_text(logs[self._runner_logs :])
        size = self._log_bytes + len(new.encode())
        if size > self.caps.log_bytes:
            self.refuse(f"the logs passed the limit of {_size(self.caps.log_bytes)}")
            return []
        self._runner_logs, self._log_bytes = len(logs), size
        self.logs += new
        return [(EventType.LOGS, line) for line in new.splitlines()]

    def take_final(self, output: Any) -> Events:
        """Take the terminal snapshot's output (as ``take_chunks`` does); its events."""
        if isinstance(output, list):
            return self.take_chunks(output)
        if output is None or self.refused is not None:
            return []
        try:
            value, size = storable_json(output)
        except Unstorable as error:
            self.refuse(str(error))
            return []
        if not self._output_fits(size):
            return []
        self.output = value
        if self._published_outputs:
            return []
        self._published_outputs = 1
        return [(EventType.OUTPUT, output_text(value))]

    def refuse(self, why: str) -> None:
        if self.refused is None:
            log.warning("prediction %s: %s; failing it", self.prediction_id, why)
            self.refused = why

    def _output_fits(self, size: int) -> bool:
        """Whether output of ``size`` bytes is within the cap; refuses the run when not."""
        if size <= self.caps.output_bytes:
            return True
        self.refuse(f"the output passed the limit of {_size(self.caps.output_bytes)}")
        return False


def _size(limit: int) -> str:
    return f"{limit / MIB:g} MiB" if limit >= MIB else f"{limit} bytes"


def _shorter(new: Any, old: Any) -> bool:
    return isinstance(new, list) and isinstance(old, list) and len(new) < len(old)
