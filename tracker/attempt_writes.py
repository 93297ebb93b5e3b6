"""A run's writes to its prediction row: claim, start, progress, end, and the reset of a run cut
short by its director's death.

A write names the attempt it belongs to and the statuses it may leave, so a stale or duplicate
worker's write matches no row and changes nothing (fencing). Callers learn whether their write
won from the returned row. Claims, starts and ends are grouped with concurrent ones through
the process's :class:`StateWrites` (``tracker.batch_writes``).
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from protocol.capabilities import UNKNOWN_HARDWARE
from protocol.timings import RunnerTimes
from tracker.batch_writes import Claim, Finish, Start, StateWrites
from tracker.db import autocommit
from tracker.render import PredictionLinks
from tracker.states import RERUN_FROM, Lifecycle, Status
from tracker.tables import Prediction

predictions = cast(Table, Prediction.__table__)


def _grouped(db: AsyncEngine | StateWrites) -> StateWrites:
    """The process's grouped writers; a bare engine writes its one row alone."""
    return db if isinstance(db, StateWrites) else StateWrites(db)


async def claim(
    db: AsyncEngine | StateWrites,
    id: str,
    owner: str,
    takeable: tuple[str, ...] = (),
    version: str | None = None,
) -> RowMapping | None:
    """Take ownership of an unfinished prediction for a new attempt.

    Only a prediction nobody claimed yet, one ``owner`` claimed before (a restarted director
    keeps its name), or one whose owner is in ``takeable`` (the caller found that director
    dead) is taken: a duplicate delivery must not fence out a live director's run. Returns the
    row after the claim (with the new attempt number), or None when the prediction is unknown,
    already terminal, or held by another owner. ``version``: the one the claimer runs, which a
    deployment's prediction takes (:class:`batch_writes.Claim`). Grouped with concurrent
    claims through ``db`` when it is the process's :class:`StateWrites`, as are starts and ends
    below.
    """
    return await _grouped(db).claims.submit(Claim(id, owner, takeable, version))


async def mark_processing(
    db: AsyncEngine | StateWrites, id: str, attempt: int, ran_for: float = 0.0
) -> RowMapping | None:
    """``starting`` → ``processing`` for this attempt, which began ``ran_for`` seconds ago;
    the row's ``started_at`` and ``cancel_requested``, or None when fenced out. Grouped with
    concurrent starts through ``db`` when it is the process's :class:`StateWrites`."""
    return await _grouped(db).starts.submit(Start(id, attempt, ran_for))


async def save_progress(engine: AsyncEngine, id: str, attempt: int, output: Any, logs: str) -> bool:
    c = predictions.c
    statement = (
        update(predictions)
        .where(c.id == id, c.attempt == attempt, c.status == Status.PROCESSING.value)
        .values(output=output, logs=logs)
    )
    async with autocommit(engine).connect() as conn:
        return (await conn.execute(statement)).rowcount == 1


async def finish(
    db: AsyncEngine | StateWrites,
    id: str,
    attempt: int,
    status: Status,
    *,
    output: Any = None,
    logs: str | None = None,
    error: str | None = None,
    times: RunnerTimes | None = None,
    hardware: str = UNKNOWN_HARDWARE,
    webhook_links: PredictionLinks | None = None,
) -> RowMapping | None:
    """Write a terminal state if this attempt still owns a prediction that may reach it.

    ``times`` are what the runner reported for the run, ``hardware`` what it runs on; both go
    into the usage record. With ``webhook_links``, the ``completed`` webhook is recorded in
    the same transaction.
    """
    write = Finish(
        id,
        attempt,
        status,
        output,
        logs,
        error,
        times or RunnerTimes(),
        hardware,
        webhook_links,
    )
    return await _grouped(db).finishes.submit(write)


async def reset_for_rerun(engine: AsyncEngine, id: str, attempt: int) -> RowMapping | None:
    """Recovery, not a transition: a run interrupted by its director's death starts over.

    Only for a prediction this attempt has just claimed while it was ``processing``; output and
    logs of the lost run are dropped so the new run's are not mixed with them.
    """
    c = predictions.c
    statement = (
        update(predictions)
        .where(c.id == id, c.attempt == attempt, c.status == RERUN_FROM.value)
        .values(status=Lifecycle.rerun().status.value, output=None, logs="", started_at=None)
        .returning(predictions)
    )
    async with autocommit(engine).connect() as conn:
        row: RowMapping | None = (await conn.execute(statement)).mappings().one_or_none()
    return row
