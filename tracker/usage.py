"""Usage: what an account's predictions cost, from the rows written with their terminal state.

A run's times come from its runner's terminal snapshot (``metrics``): ``predict_time`` (Cog's,
seconds the model ran), and two Conduit extensions a stock Cog runner does not send,
``queue_wait_time`` (seconds queued inside the runner before a slot freed) and ``gpu_time``; and
``load_time``, the cold start a model pool host held the run for (evictions and the model's
load), which it reports on the start (``protocol.headers.LOAD_TIME``), not in a snapshot.

A runner's word is never billed past what its director saw: ``RunnerTimes.within`` bounds the
reported times by the director's own observation of the run (see there); ``RunnerTimes`` is
the runner contract's (:mod:`protocol.timings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from protocol.timings import RunnerTimes
from tracker.db import autocommit
from tracker.record_tables import UsageRecord

CPU = "cpu"


def remote_times(metrics: Mapping[str, Any]) -> list[float]:
    """Each reported run's time on its runner (its load, queued there, running), in seconds.

    A prediction's ``metrics`` describe the run that finished it; a run lost with its director
    never reported, so there is at most one entry. Empty when the runner reported nothing.
    """
    times = RunnerTimes.from_metrics(metrics)
    if times.predict_time is None:
        return []
    return [times.predict_time + (times.queue_wait_time or 0.0) + (times.load_time or 0.0)]


async def summary(
    engine: AsyncEngine, account_id: int, start: datetime | None, end: datetime | None
) -> dict[str, Any]:
    """Totals and a per-deployment breakdown for ``[start, end)``."""
    u = UsageRecord
    sums = {
        "predict_time": u.predict_time,
        "gpu_time": u.gpu_time,
        "cpu_time": u.cpu_time,
        "billable_seconds": u.billable_seconds,
    }
    query = select(
        func.coalesce(u.deployment, u.model).label("deployable"),
        func.count().label("predictions"),
        *(func.coalesce(func.sum(column), 0.0).label(name) for name, column in sums.items()),
    ).where(u.account_id == account_id)
    if start is not None:
        query = query.where(u.created_at >= start)
    if end is not None:
        query = query.where(u.created_at < end)
    query = query.group_by("deployable").order_by("deployable")
    async with autocommit(engine).connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    items = [
        {
            "deployable": row["deployable"],
            "predictions": row["predictions"],
            **{name: round(float(row[name]), 6) for name in sums},
        }
        for row in rows
    ]
    return {
        "predictions": sum(i["predictions"] for i in items),
        **{name: round(sum(i[name] for i in items), 6) for name in sums},
        "by_deployable": items,
    }
