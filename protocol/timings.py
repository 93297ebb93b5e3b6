"""Runner timings: what a runner says about the time a run took, and how far it is believed.

Two sources. A run's snapshots carry ``metrics`` (``predict_time``, Cog's; ``queue_wait_time``
and ``gpu_time``, Conduit's), and a model pool host answers a start with how long it held it
(:data:`protocol.headers.LOAD_TIME`, :data:`protocol.headers.POOL_QUEUE_WAIT`):
:class:`RunnerTimes`, which the tracker records and bills. Every prediction answer also carries
timing headers (:data:`protocol.headers.QUEUE_WAIT_MS`, :data:`protocol.headers.PROCESSING_TIME`,
and the figures a caller passes on as they are): :class:`RunnerTiming`, which the synchronous
lane reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from protocol.headers import (
    CACHE_HIT,
    CACHE_TOKENS_REUSED,
    GPU_TIME_MS,
    PROCESSING_TIME,
    QUEUE_WAIT_MS,
)

#: The runner's figures a caller passes on to its own client as they are.
FORWARDED: Final = (GPU_TIME_MS, CACHE_HIT, CACHE_TOKENS_REUSED)


@dataclass(frozen=True, slots=True)
class RunnerTiming:
    """What a prediction answer's timing headers say (absent or unreadable ones are None)."""

    queue_wait_ms: float | None = None
    processing_s: float | None = None
    forwarded: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RunnerTiming:
        return cls(
            _float(headers.get(QUEUE_WAIT_MS)),
            _float(headers.get(PROCESSING_TIME)),
            {name: value for name in FORWARDED if (value := headers.get(name)) is not None},
        )


def decimal_seconds(value: float) -> str:
    """Seconds as the timing headers write them: a decimal, to the microsecond, no zeros after
    the last significant digit (``X-Processing-Time: 0.0125``)."""
    return f"{value:.6f}".rstrip("0").rstrip(".") or "0"


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


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
