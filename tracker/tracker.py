"""One attempt at one prediction: apply runner snapshots, write them durably (fenced), and tell
the world: the per-prediction event stream and the client's webhooks.

Status changes are written at once; output and logs are accumulated and flushed at most every
``flush_interval`` seconds and at the end, so a model that yields a token every millisecond costs
two writes a second, not a thousand. Events are appended as they happen. The ``completed``
webhook is stored in the terminal state's own transaction.

What a runner sends is kept only as Postgres can store it and Conduit can send it
(:mod:`tracker.run_output`): output or logs past their caps, or output no escaping makes
storable, stop the run: ``refused`` says why, and the prediction fails with it. A terminal
write that Postgres refuses (a data error, never an outage) is written again as a failure
without the new output; if even that is refused, :class:`UnrecordableResult` tells the director
to dead-letter the entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from sqlalchemy.engine import RowMapping
from sqlalchemy.exc import DBAPIError

from core.transient import TRANSIENT, persistently
from protocol.capabilities import UNKNOWN_HARDWARE
from protocol.timings import RunnerTimes
from tracker import attempt_writes, store
from tracker.batch_writes import StateWrites, ran
from tracker.deliveries import wants
from tracker.events import EventType
from tracker.fence import Fence
from tracker.publishing import Publishing
from tracker.render import render_prediction, storable_text
from tracker.run_output import Caps, RunOutput
from tracker.states import Lifecycle, Status, check_transition

log = logging.getLogger(__name__)

#: What a terminal write may fail with that is the data's fault, not an outage's.
DATA_ERRORS = (DBAPIError, TypeError, ValueError)


class UnrecordableResult(Exception):
    """Postgres refused even the failure recorded in place of a run's result."""


class AttemptTracker:
    def __init__(
        self,
        writes: StateWrites,
        row: Mapping[Any, Any],
        publishing: Publishing,
        flush_interval: float = 0.5,
        hardware: str = UNKNOWN_HARDWARE,
        lifecycle: Lifecycle | None = None,
        caps: Caps | None = None,
    ) -> None:
        """``writes``: the process's grouped state writes (concurrent attempts share their
        statements). ``lifecycle`` defaults to the status the claim read."""
        self.writes = writes
        self.engine = writes.engine
        self.prediction_id: str = row["id"]
        self.attempt: int = row["attempt"]
        self.state = dict(row)
        self.publishing = publishing
        self.flush_interval = flush_interval
        #: What the runner runs on, for the usage record.
        self.hardware = hardware
        self.lifecycle = lifecycle or Lifecycle.claimed(row["status"])
        #: What the run produced so far, as it can be kept.
        self.run = RunOutput(self.prediction_id, caps or Caps())
        self._dirty = False
        self._flusher: asyncio.Task[None] | None = None
        #: Set when the start found a cancel already flagged in Postgres: a cancel published
        #: while nobody listened. The execution cancels on the runner when it sees it.
        self.cancel_requested = False
        #: Whether the ``processing`` status event went out (before the start was written).
        self._announced = False

    @property
    def status(self) -> Status:
        return self.lifecycle.status

    @property
    def output(self) -> Any:
        return self.run.output

    @property
    def logs(self) -> str:
        return self.run.logs

    @property
    def refused(self) -> str | None:
        """Why this run's output or logs cannot be kept: the prediction fails with it."""
        return self.run.refused

    @property
    def fence(self) -> Fence:
        return self.publishing.fence

    @property
    def _wants_completed(self) -> bool:
        return wants(self.state, "completed")

    @property
    def announces_start(self) -> bool:
        """Whether a ``start`` webhook is due when the model starts. Without one, a run whose
        end is already known may have its start written with its end, in one write."""
        return self.publishing.webhooks is not None and wants(self.state, "start")

    @property
    def start_may_wait(self) -> bool:
        """Whether the start may be written after the model began: no intermediate webhook
        is due, whose body would say ``starting`` while the model runs."""
        return self.publishing.webhooks is None

    def _body(self) -> str:
        state = {
            **self.state,
            "status": self.status.value,
            "output": self.output,
            "logs": self.logs,
        }
        return orjson.dumps(render_prediction(state, self.publishing.links)).decode()

    def _offer(self, event: str) -> None:
        if self.publishing.webhooks is not None:
            self.publishing.webhooks.offer(event, self._body)

    async def running(self) -> None:
        """The model runs, its start not written yet (``start_write_delay``): the event
        stream says so now, in order before its output; the row when the start is written."""
        if self.status is Status.STARTING and not self._announced:
            self._announced = True
            await self._publish([(EventType.STATUS, Status.PROCESSING.value)])

    async def started(self, ran_for: float = 0.0) -> bool:
        """Record that the model began running, ``ran_for`` seconds ago. False when this
        attempt no longer owns it."""
        if self.status is not Status.STARTING:
            return True
        row = await persistently(
            f"recording start of {self.prediction_id}",
            lambda: attempt_writes.mark_processing(
                self.writes, self.prediction_id, self.attempt, ran_for
            ),
        )
        if row is None:
            return False
        self.lifecycle.move(Status.PROCESSING)
        self.state["started_at"] = row["started_at"]
        self.cancel_requested = bool(row["cancel_requested"])
        if not self._announced:
            self._announced = True
            await self._publish([(EventType.STATUS, Status.PROCESSING.value)])
        self._offer("start")
        if self._dirty:
            self._schedule_flush()
        return True

    async def progress(self, output: Any, logs: str | None) -> None:
        """Take a runner snapshot. Snapshots can arrive out of order: never go backwards."""
        if self.fence.lost or self.refused is not None:
            return
        events = self.run.take(output, logs)
        if not events:
            return
        await self._publish(events)
        if any(kind is EventType.OUTPUT for kind, _ in events):
            self._offer("output")
        if any(kind is EventType.LOGS for kind, _ in events):
            self._offer("logs")
        self._dirty = True
        if self.status is Status.PROCESSING:
            self._schedule_flush()

    async def _publish(self, events: list[tuple[EventType, str]]) -> None:
        """Live events are best effort: a Redis blip must not fail the prediction. Only an
        attempt that still holds its prediction appends them (the terminal events follow a
        fenced write that won, and go out through ``finish``)."""
        if not await self.fence.held():
            return
        try:
            await self.publishing.events.append(self.prediction_id, events)
        except TRANSIENT as error:
            log.debug("events of %s not published: %r", self.prediction_id, error)

    def _schedule_flush(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        """Write the accumulated progress, at most once per ``flush_interval``, until nothing
        new is left: snapshots that arrive during a write, or a write that failed, are caught
        by the next round rather than waiting for the next snapshot."""
        while self._dirty and not self.fence.lost:
            await asyncio.sleep(self.flush_interval)
            self._dirty = False
            try:
                saved = await attempt_writes.save_progress(
                    self.engine, self.prediction_id, self.attempt, self.output, self.logs
                )
            except TRANSIENT as error:  # the next round, or the terminal write, catches up
                log.debug("progress of %s not saved: %r", self.prediction_id, error)
                self._dirty = True
                continue
            except DATA_ERRORS as error:  # not an outage: the terminal write deals with it
                log.warning("progress of %s refused: %r", self.prediction_id, error)
                return
            if not saved:
                self.fence.revoke("a progress write found another attempt in charge")

    async def finish(
        self,
        status: Status,
        *,
        output: Any = None,
        logs: str | None = None,
        error: str | None = None,
        times: RunnerTimes | None = None,
    ) -> RowMapping | None:
        """Write the terminal state; None when another attempt or a cancel got there first.

        ``times`` are what the runner reported for the run, when it did.
        """
        check_transition(self.status, status)  # fail loudly before writing anything
        await self._stop_flusher()
        last_chunks = self.run.take_final(output) + self.run.take_logs(logs)
        if self.refused is not None:
            status, error = Status.FAILED, self.refused
        error = storable_text(error) if error is not None else None
        ran_unannounced = self.status is Status.STARTING and not self._announced
        if ran_unannounced and ran(status, times or RunnerTimes()):
            last_chunks.insert(0, (EventType.STATUS, Status.PROCESSING.value))
        try:
            row = await self._write_end(status, self.output, self.logs, error, times)
        except TRANSIENT:
            raise
        except DATA_ERRORS as failure:
            # Not an outage: writing it again changes nothing. Record the failure instead,
            # keeping the output and logs already saved.
            log.error("the end of %s was refused: %r", self.prediction_id, failure)
            status, error = Status.FAILED, f"the result could not be recorded: {_reason(failure)}"
            last_chunks = [event for event in last_chunks if event[0] is EventType.STATUS]
            try:
                row = await self._write_end(status, None, None, error, times)
            except TRANSIENT:
                raise
            except DATA_ERRORS as again:
                raise UnrecordableResult(error) from again
        if row is None:
            return None
        if self.publishing.webhooks is not None:
            # Returns at once (a slow receiver never holds up "done"); dropping what is pending
            # now, before the status changes, keeps an intermediate webhook from carrying it.
            self.publishing.webhooks.close()
        self.lifecycle.move(status)
        final = orjson.dumps(render_prediction(row, self.publishing.links)).decode()
        # Waiters and streams end on "done": it must get out even through a Redis blip.
        await persistently(
            f"publishing the end of {self.prediction_id}",
            lambda: self.publishing.events.finish(
                self.prediction_id, status.value, error, last_chunks, final
            ),
        )
        if self.publishing.dispatcher is not None and self._wants_completed:
            self.publishing.dispatcher.wake()
        return row

    async def _write_end(
        self,
        status: Status,
        output: Any,
        logs: str | None,
        error: str | None,
        times: RunnerTimes | None,
    ) -> RowMapping | None:
        """The terminal write, through outages. ``None`` output or logs keep what is saved."""
        return await persistently(
            f"recording the end of {self.prediction_id}",
            lambda: attempt_writes.finish(
                self.writes,
                self.prediction_id,
                self.attempt,
                status,
                output=output,
                logs=logs,
                error=error,
                times=times,
                hardware=self.hardware,
                webhook_links=self.publishing.links if self._wants_completed else None,
            ),
        )

    async def _stop_flusher(self) -> None:
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        self._dirty = False

    async def close(self) -> None:
        """Stop this attempt's background work. Never waits on a webhook receiver."""
        await self._stop_flusher()
        if self.publishing.webhooks is not None:
            self.publishing.webhooks.close()

    async def earlier_output(self) -> bool:
        """Whether the event stream already holds output from an earlier attempt's run.

        Streamed chunks cannot be taken back: were this attempt to run the model again, a
        client following the stream would see both runs' output, and the final output would
        differ from what it read.
        """
        return await self.publishing.events.has_output(self.prediction_id)

    async def cancel_flagged(self) -> bool:
        """Whether a cancel is flagged in Postgres: cancels are published fire-and-forget, so
        one sent while nobody listened is only there."""
        return await store.cancel_requested(self.engine, self.prediction_id)

    async def ended(self) -> bool:
        """Whether the prediction is terminal (or gone): asked once this attempt was fenced
        out, to learn whether another attempt or a cancel ended it."""
        row = await store.get(self.engine, self.prediction_id)
        return row is None or Status(row["status"]).is_terminal


def _reason(error: BaseException) -> str:
    """The first line of what refused a write (never the statement or its parameters)."""
    cause = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    first = (str(cause).splitlines() or [type(cause).__name__])[0]
    return storable_text(f"{type(cause).__name__}: {first}")[:300]
