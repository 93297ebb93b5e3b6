"""Usage: what an account's predictions cost, from the rows written with their terminal state.

A run's times come from its runner's terminal snapshot (``metrics``): ``predict_time`` (Cog's,
seconds the model ran), and two Conduit extensions a stock Cog runner does not send,
``queue_wait_time`` (seconds queued inside the runner before a slot freed) and ``gpu_time``; and
``load_time``, the cold start a model pool host held the run for (evictions and the model's
load), which it reports on the start (``runners.protocol.LOAD_TIME``), not in a snapshot.

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
    load_time: float | None = None

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> RunnerTimes:
        return cls(
            _seconds(metrics.get("predict_time")),
            _seconds(metrics.get("queue_wait_time")),
            _seconds(metrics.get("gpu_time")),
            _seconds(metrics.get("load_time")),
        )

    @classmethod
    def from_start(cls, load_time: Any, queue_wait_time: Any) -> RunnerTimes:
        """What a model pool host said about a start (its headers' values): the cold start it
        sat through and its queueing once the model was ready."""
        return cls(None, _seconds(_number(queue_wait_time)), None, _seconds(_number(load_time)))

    def with_start(self, start: RunnerTimes) -> RunnerTimes:
        """These (a snapshot's) times with those of the start added: its load time, and its
        queueing in the pool on top of the model server's own."""
        queued = [t for t in (self.queue_wait_time, start.queue_wait_time) if t is not None]
        return RunnerTimes(
            self.predict_time,
            sum(queued) if queued else None,
            self.gpu_time,
            start.load_time if start.load_time is not None else self.load_time,
        )

    def public_metrics(self) -> dict[str, float]:
        """The reported times as they appear in a prediction's ``metrics``."""
        reported = {
            "predict_time": self.predict_time,
            "queue_wait_time": self.queue_wait_time,
            "gpu_time": self.gpu_time,
            "load_time": self.load_time,
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
        most what is left of it after the run, ``load_time`` (before the queueing and the run)
        at most what is left after both, and ``gpu_time`` (the run's time on a GPU) at most
        ``observed`` as well.
        """
        window = max(observed, 0.0)
        predict = _at_most(self.predict_time, window)
        left = window - (predict or 0.0)
        queued = _at_most(self.queue_wait_time, left)
        load = _at_most(self.load_time, left - (queued or 0.0))
        return RunnerTimes(predict, queued, _at_most(self.gpu_time, window), load)


def _at_most(value: float | None, limit: float) -> float | None:
    return None if value is None else min(value, limit)


def _number(value: Any) -> Any:
    """A header's text as a number (None when it is none), for :func:`_seconds`."""
    if not isinstance(value, str):
        return value
    try:
        return float(value.strip())
    except ValueError:
        return None


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
