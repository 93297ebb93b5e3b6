"""Retention: what Conduit keeps of finished predictions and files, and for how long.

As Replicate does for predictions made through the API, a prediction's data (its input,
output and logs) and its output files go ``output_retention`` seconds after it ended: the row
stays, with ``data_removed`` set, so its status, metrics and timings remain readable. Uploads
go when their ``expires_at`` passes, and a deleted file's bytes once the store let go of them.

Every api replica runs a sweep; each pass takes at most ``batch`` rows of each kind, chosen with
``FOR UPDATE SKIP LOCKED``, so replicas share the work instead of waiting on each other, and a
backlog drains over several passes without one long transaction. A file's row is deleted only
after its bytes are gone: an unreachable store leaves the row (already invisible to clients)
for a later pass, so no object is ever orphaned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core.periodic import Periodic
from core.transient import TRANSIENT
from files.settings import FileSettings
from files.store import FileStore, StoreUnavailable
from tracker.states import TERMINAL, sql_list

log = logging.getLogger(__name__)

#: Objects deleted from the store at once within a pass.
PARALLEL_DELETES = 8

_TERMINAL = sql_list(tuple(sorted(s.value for s in TERMINAL)))

# ``NOT data_removed`` as written here is what lets Postgres use the partial index
# ``ix_predictions_retention`` (``predictions(completed_at) WHERE NOT data_removed``).
_CLEAR_PREDICTIONS = text(
    f"""
    WITH due AS (
        SELECT id FROM predictions
        WHERE NOT data_removed
            AND completed_at < CAST(:now AS timestamptz) - make_interval(secs => :retention)
            AND status IN {_TERMINAL}
        ORDER BY completed_at
        LIMIT :batch
        FOR UPDATE SKIP LOCKED
    )
    UPDATE predictions p
    SET input = '{{}}'::jsonb, output = NULL, logs = '', data_removed = true
    FROM due WHERE p.id = due.id
    RETURNING p.id
    """
)
_DELETE_OUTPUT_FILES = text(
    "UPDATE files SET deleted_at = CAST(:now AS timestamptz) "
    "WHERE prediction_id = ANY(CAST(:ids AS varchar[])) AND deleted_at IS NULL"
)
_DUE_FILES = text(
    """
    SELECT id, storage_key FROM files
    WHERE deleted_at IS NOT NULL OR expires_at < CAST(:now AS timestamptz)
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
    """
)
_FORGET_FILES = text("DELETE FROM files WHERE id = ANY(CAST(:ids AS varchar[]))")
_NOW = text("SELECT now()")


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one pass did."""

    #: Predictions whose input, output and logs were removed.
    predictions: int = 0
    #: Output files of those predictions marked deleted.
    output_files: int = 0
    #: File rows removed, their bytes gone from the store.
    files: int = 0
    #: Due files left for a later pass because the store could not delete their bytes.
    files_left: int = 0


class RetentionSweep:
    """One replica's share of retention; ``sweep_once`` is a pass (run it periodically).

    ``clock`` gives the time rows are judged against; unset, the database's ``now()`` (one
    clock for every replica)."""

    def __init__(
        self,
        engine: AsyncEngine,
        store: FileStore,
        settings: FileSettings,
        *,
        batch: int = 500,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError("batch must be at least 1")
        self.engine = engine
        self.store = store
        self.settings = settings
        self.batch = batch
        self.clock = clock

    def periodic(self, interval: float) -> Periodic:
        """A pass every ``interval`` seconds once started (an outage of Postgres or Redis
        is only a missed pass; the store's is handled within the pass)."""
        return Periodic(
            "files-retention", interval, self.sweep_once, "file retention sweep", log, TRANSIENT
        )

    async def sweep_once(self) -> SweepResult:
        predictions, output_files = await self._clear_predictions()
        files, left = await self._remove_files()
        return SweepResult(predictions, output_files, files, left)

    async def _now(self, conn: AsyncConnection) -> datetime:
        if self.clock is not None:
            return self.clock()
        now: datetime = (await conn.execute(_NOW)).scalar_one()
        return now

    async def _clear_predictions(self) -> tuple[int, int]:
        """Remove the data of at most ``batch`` predictions past retention, and mark their
        output files deleted, in one transaction."""
        retention = self.settings.output_retention
        if retention == 0:
            return 0, 0
        async with self.engine.begin() as conn:
            now = await self._now(conn)
            params = {"now": now, "retention": retention, "batch": self.batch}
            ids = list((await conn.execute(_CLEAR_PREDICTIONS, params)).scalars())
            if not ids:
                return 0, 0
            marked = await conn.execute(_DELETE_OUTPUT_FILES, {"now": now, "ids": ids})
        if len(ids) == self.batch:
            log.info("removed the data of %d predictions; more are due", len(ids))
        return len(ids), marked.rowcount

    async def _remove_files(self) -> tuple[int, int]:
        """Delete the bytes of at most ``batch`` due files, then the rows of those gone. The
        rows stay locked meanwhile, so no other replica deletes the same objects."""
        async with self.engine.begin() as conn:
            now = await self._now(conn)
            rows = (await conn.execute(_DUE_FILES, {"now": now, "batch": self.batch})).all()
            if not rows:
                return 0, 0
            gone, error = await self._delete_objects([(row.id, row.storage_key) for row in rows])
            if gone:
                await conn.execute(_FORGET_FILES, {"ids": gone})
        left = len(rows) - len(gone)
        if error is not None:
            log.warning(
                "the file store could not delete %d due files; they stay for a later pass: %s",
                left,
                error,
            )
        return len(gone), left

    async def _delete_objects(
        self, due: Sequence[tuple[str, str]]
    ) -> tuple[list[str], StoreUnavailable | None]:
        """The ids whose objects are gone, and the store's failure, if one stopped the pass
        (the rest is not tried: an unreachable store would fail each in turn)."""
        gone: list[str] = []
        for start in range(0, len(due), PARALLEL_DELETES):
            chunk = due[start : start + PARALLEL_DELETES]
            outcomes = await asyncio.gather(
                *(self.store.delete(key) for _, key in chunk), return_exceptions=True
            )
            failure: StoreUnavailable | None = None
            for (file_id, _), outcome in zip(chunk, outcomes, strict=True):
                if outcome is None:
                    gone.append(file_id)
                elif isinstance(outcome, StoreUnavailable):
                    failure = failure or outcome
                elif isinstance(outcome, Exception):
                    # This one object only (e.g. a key the store refuses): its row stays.
                    log.error("file %s could not be removed: %r", file_id, outcome)
                else:
                    raise outcome
            if failure is not None:
                return gone, failure
        return gone, None
