"""Claiming a queue entry's prediction, and what a claim of a prediction left running means.

A claim is a conditional UPDATE: taken when unclaimed, claimed by this director's name
before, or claimed by a director that is no longer running it (dead, or alive and waiting to
retry it). One running on a live director is left alone and this duplicate entry dropped
(that director's own entry and the reconciler cover the rest). A prediction claimed while
``processing`` was left behind by a dead director: this director's runner may still be running
it (``attach``: follow it, nothing runs twice), or it runs again from scratch if the deployment
allows another run (``rerun``), or it fails as interrupted.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

import orjson
from sqlalchemy.engine import RowMapping

from director.queue import Entry, Queue
from director.runner_monitor import RunnerMonitor
from protocol.capabilities import STOCK_COG
from protocol.client import RunnerClient
from protocol.errors import RunnerError
from protocol.feed import SnapshotFeed
from tracker.events import EventLog
from tracker.ledger import Ledger
from tracker.render import PredictionLinks, render_prediction
from tracker.states import Status

log = logging.getLogger(__name__)


class Unclaimed(enum.Enum):
    """Why a claim gave no row to run."""

    #: Nothing to run here: finished already, or running on a live director. Acknowledge.
    DROP = "drop"
    #: Changed hands while this director looked: leave the entry pending, look again later.
    LATER = "later"


@dataclass(frozen=True, slots=True)
class Claimed:
    row: RowMapping


class Claims:
    def __init__(
        self,
        ledger: Ledger,
        queue: Queue,
        consumer: str,
        events: EventLog,
        links: PredictionLinks,
    ) -> None:
        self.ledger = ledger
        self.queue = queue
        self.consumer = consumer
        self.events = events
        self.links = links

    async def claim(self, entry: Entry, version: str | None = None) -> Claimed | Unclaimed:
        """``version``: the one this director's runner serves (a deployment's prediction runs
        on it)."""
        prediction_id = entry.prediction_id
        row = await self.ledger.claim(prediction_id, self.consumer, version=version)
        if row is not None:
            return Claimed(row)
        current = await self.ledger.row(prediction_id)
        if current is None or Status(current["status"]).is_terminal:
            await self._ensure_done(current)
            return Unclaimed.DROP
        owner: str | None = current["claim_owner"]
        if owner is not None and await self._runs(owner, prediction_id):
            log.info(
                "%s is running on live director %s: dropping duplicate entry %s of %s",
                prediction_id,
                owner,
                entry.id,
                entry.stream,
            )
            return Unclaimed.DROP
        takeable = (owner,) if owner is not None else ()
        row = await self.ledger.claim(prediction_id, self.consumer, takeable, version)
        return Claimed(row) if row is not None else Unclaimed.LATER

    async def _runs(self, owner: str, prediction_id: str) -> bool:
        """Whether director ``owner`` is alive and ran the prediction at its last heartbeat.

        A live owner that does not run it has it waiting for a retry (its runner went away),
        or lost its entry to this director's takeover of entries idle past the visibility
        timeout: dropping this entry then would leave the prediction in no stream, to be
        re-enqueued as a new entry whose deliveries count from one again."""
        running = await self.queue.running_on(owner)
        return running is not None and prediction_id in running

    async def _ensure_done(self, row: RowMapping | None) -> None:
        """A terminal prediction whose entry is still here: its director died after the commit
        and before the ack, maybe before publishing ``done``. Publish it, once."""
        if row is None or not Status(row["status"]).is_terminal:
            return
        if await self.events.is_done(row["id"]):
            return
        final = orjson.dumps(render_prediction(row, self.links)).decode()
        await self.events.finish(row["id"], row["status"], row["error"], final=final)

    async def rerun(self, row: RowMapping, max_runs: int) -> Claimed | Unclaimed | None:
        """A run lost with its director starts over if the deployment allows another run;
        None when it does not (the caller fails it as interrupted). A row that changed since
        this attempt claimed it (another attempt took it, or it ended) is not this attempt's to
        fail: ``Unclaimed.DROP`` when it is terminal, else ``Unclaimed.LATER``."""
        if row["runs"] >= max_runs:
            return None
        rerun = await self.ledger.reset_for_rerun(row["id"], row["attempt"])
        if rerun is not None:
            log.info("re-running %s (run %d)", row["id"], row["runs"] + 1)
            return Claimed(rerun)
        current = await self.ledger.row(row["id"])
        log.info("%s changed before its re-run (attempt %d): leaving it", row["id"], row["attempt"])
        if current is None or Status(current["status"]).is_terminal:
            await self._ensure_done(current)
            return Unclaimed.DROP
        return Unclaimed.LATER


async def attach(
    runner: RunnerClient,
    monitor: RunnerMonitor,
    row: RowMapping,
    webhook: str,
    priority: str,
    output_file_prefix: str | None = None,
) -> SnapshotFeed | None:
    """The run a dead director left behind, when this director's runner is still running it:
    from now on its snapshots come here, and nothing runs twice. Only a Conduit runner can be
    asked; a stock Cog server would start a second run."""
    if monitor.capabilities.kind == STOCK_COG.kind:
        return None
    prediction_id = row["id"]
    try:
        feed = await runner.attach(
            prediction_id,
            row["input"],
            webhook,
            tenant=str(row["account_id"]),
            priority=priority,
            output_file_prefix=output_file_prefix,
        )
    except RunnerError as error:
        log.info("could not ask the runner about %s: %r", prediction_id, error)
        return None
    if feed is not None:
        log.info(
            "%s is still running on the runner: following it (attempt %d)",
            prediction_id,
            row["attempt"],
        )
    return feed
