"""Usage: what an account's predictions cost, from the rows written with their terminal state.

A run's times come from its runner's terminal snapshot (``metrics``): ``predict_time`` (Cog's,
seconds the model ran), and two Conduit extensions a stock Cog runner does not send,
``queue_wait_time`` (seconds queued inside the runner before a slot freed) and ``gpu_time``.

A runner's word is never billed past what its director saw: ``RunnerTimes.within`` bounds the
reported times by the director's own observation of the run (see there).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tracker.db import autocommit
from tracker.tables import UsageRecord

#: ``hardware`` of a runner that did not say what it runs on (a stock Cog server).
UNKNOWN_HARDWARE = "runner"
CPU = "cpu"


@dataclass(frozen=True, slots=True)
class RunnerTimes:
    """The seconds a runner reported for one run; None for what it did not report."""

    predict_time: float | None = None
    queue_wait_time: float | None = None
    gpu_time: float | None = None

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> RunnerTimes:
        return cls(
            _seconds(metrics.get("predict_time")),
            _seconds(metrics.get("queue_wait_time")),
            _seconds(metrics.get("gpu_time")),
        )

    def public_metrics(self) -> dict[str, float]:
        """The reported times as they appear in a prediction's ``metrics``."""
        reported = {
            "predict_time": self.predict_time,
            "queue_wait_time": self.queue_wait_time,
            "gpu_time": self.gpu_time,
        }
        return {name: value for name, value in reported.items() if value is not None}

    def within(self, observed: float) -> RunnerTimes:
        """These times as far as ``observed`` seconds allow: the wall time the director saw
        the run take, on its own clock, from handing the prediction to the runner to taking
        its end.

        ``predict_time`` is billed as reported (``billable_seconds``, ``cpu_time``), and the
        reports arrive over a network: a runner that lies, or anyone who learned a webhook
        URL, could otherwise bill an account for hours of a one-second run. An honest runner
        is never cut: its run and its queue wait happen inside the director's window, one
        after the other. So ``predict_time`` is at most ``observed``, ``queue_wait_time`` at
        most what is left of it after the run, and ``gpu_time`` (the run's time on a GPU) at
        most ``observed`` as well.
        """
        window = max(observed, 0.0)
        predict = _at_most(self.predict_time, window)
        queued = _at_most(self.queue_wait_time, window - (predict or 0.0))
        return RunnerTimes(predict, queued, _at_most(self.gpu_time, window))


def _at_most(value: float | None, limit: float) -> float | None:
    return None if value is None else min(value, limit)


def _seconds(value: Any) -> float | None:
    """A reported time, or None for what is not one: NaN in particular, which every bound
    (``min(nan, x)`` is ``nan``) would let through to billing, and an integer past any float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def remote_times(metrics: Mapping[str, Any]) -> list[float]:
    """Each reported run's time on its runner (queued there plus running), in seconds.

    A prediction's ``metrics`` describe the run that finished it; a run lost with its director
    never reported, so there is at most one entry. Empty when the runner reported nothing.
    """
    times = RunnerTimes.from_metrics(metrics)
    if times.predict_time is None:
        return []
    return [times.predict_time + (times.queue_wait_time or 0.0)]


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
