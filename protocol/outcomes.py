"""What the runner client's calls come back with: a start the runner took (:class:`Accepted`)
and how a synchronous call went (:class:`RunAnswer`, its finished prediction read by
:func:`finished`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pydantic

from protocol.answers import Reading, Verdict
from protocol.documents import PredictionResponse
from protocol.feed import SnapshotFeed
from protocol.timings import RunnerTimes, RunnerTiming

__all__ = ["Accepted", "RunAnswer", "finished"]


@dataclass(frozen=True, slots=True)
class Accepted:
    """A start the runner took."""

    feed: SnapshotFeed | None
    """Its snapshot stream (a Conduit runner's); None: its webhooks say what happens."""
    times: RunnerTimes
    """What a model pool host held it for before passing it on (``load_time``, and its
    ``queue_wait_time``); empty from any other runner."""


@dataclass(frozen=True, slots=True)
class RunAnswer:
    """How a synchronous call went. ``accepted``: ``prediction`` is the finished one, or
    ``feed`` yields its snapshots (until the runner ends the response)."""

    reading: Reading
    prediction: PredictionResponse | None = None
    feed: SnapshotFeed | None = None
    timing: RunnerTiming = field(default_factory=RunnerTiming)
    text: str = ""
    """The answer's body when it was not accepted."""

    @property
    def verdict(self) -> Verdict:
        return self.reading.verdict


def finished(reading: Reading, text: str, timing: RunnerTiming) -> RunAnswer:
    """A synchronous call's accepted answer: the finished prediction, or ``broken`` when the
    body is not one."""
    try:
        prediction = PredictionResponse.model_validate_json(text)
    except pydantic.ValidationError as error:
        detail = f"unreadable answer from the runner: {error}"
        return RunAnswer(_broken(reading, detail), timing=timing, text=text)
    if not prediction.status.is_terminal:
        detail = f"the runner answered {prediction.status.value}"
        return RunAnswer(_broken(reading, detail), timing=timing, text=text)
    return RunAnswer(reading, prediction=prediction, timing=timing)


def _broken(reading: Reading, detail: str) -> Reading:
    return Reading(Verdict.BROKEN, reading.status, detail=detail)
