"""What a call to a runner raises, one class per verdict of :mod:`protocol.answers`.

Exception tree::

    RunnerError             the runner is unreachable or broke the protocol (infrastructure)
    ├── RunnerUnauthorized  401/403: the runner refused the caller's token (configuration)
    ├── NotRunning          412 to an attach: the runner is not running the prediction
    └── RunnerRefused       it answered but will not take the prediction now; retry later
        ├── RunnerBusy          409: every slot in use, and no queue (stock Cog)
        ├── RunnerSaturated     503 problem+json or the spec's queue_full: its queue is full
        ├── RunnerNotReady      503 + Cog body: setup running or failed, model not loaded
        └── RateLimited         429: the tenant's rate limit on this runner
    InputRejected           400/422: the runner refused the input (a prediction failure)
    OutOfTime               422/504 deadline_*: a model pool cannot run it in the time it has
    CannotServe             422 model_too_large: a model pool can never run this model

``InputRejected`` alone is the client's doing; ``OutOfTime`` and ``CannotServe`` end the
prediction on this runner without blaming its input.
"""

from __future__ import annotations

import json
from typing import ClassVar

from protocol.answers import Reading, Refusal, Verdict
from protocol.values import DeadlineCode


class RunnerError(Exception):
    """The runner could not be reached or answered in a way the protocol does not allow.

    An infrastructure failure: the prediction is not failed for it; the queue entry stays
    unacknowledged so the prediction is retried.
    """


class NoAnswer(RunnerError):
    """The request may have reached the runner, but no answer came: the connection broke off
    or timed out after it was made. Unlike a refused connection or an answer, this does not
    say the runner started nothing: one that died running it would run it again if sent it
    once more after a restart."""


class RunnerUnauthorized(RunnerError):
    """401 (no or another token) or 403 (an internal call from off loopback to a runner
    without a token): the caller and the runner disagree on ``CONDUIT_RUNNER_TOKEN``. An
    infrastructure failure like any other: nothing about the prediction is wrong."""


class NotRunning(RunnerError):
    """412 to an attach: the runner is not running the prediction."""


class RunnerRefused(RunnerError):
    """The runner will not take the prediction now; ``retry_after`` is when it suggests to
    ask again (seconds, from ``Retry-After``), None when it did not say."""

    #: Label of the refusal in metrics.
    reason: ClassVar[str] = "refused"
    #: How the refusal reads in a prediction's error ("runner stayed <state> ...").
    state: ClassVar[str] = "refusing"

    def __init__(self, detail: str, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.retry_after = retry_after


class RunnerBusy(RunnerRefused):
    """409: every prediction slot is in use (a stock Cog server queues nothing)."""

    reason = Refusal.BUSY.value
    state = "busy (409 all slots busy)"


class RunnerSaturated(RunnerRefused):
    """503 problem+json (a Conduit runner, a model pool host) or the spec's ``queue_full``
    error: the runner's queue is full."""

    reason = Refusal.SATURATED.value
    state = "saturated (503 queue full)"


class RunnerNotReady(RunnerRefused):
    """503 with Cog's body: setup has not finished (or failed), or no model is loaded."""

    reason = Refusal.NOT_READY.value
    state = "not ready (503 setup not finished)"


class RateLimited(RunnerRefused):
    """429: the account (``X-Tenant-ID``) is over its rate limit on this runner."""

    reason = Refusal.RATE_LIMITED.value
    state = "rate limited (429 tenant over its limit)"


_REFUSED: dict[Refusal, type[RunnerRefused]] = {
    Refusal.BUSY: RunnerBusy,
    Refusal.SATURATED: RunnerSaturated,
    Refusal.NOT_READY: RunnerNotReady,
    Refusal.RATE_LIMITED: RateLimited,
}


class InputRejected(Exception):
    """400/422: the runner refused the input. A prediction failure, not an infrastructure one."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class OutOfTime(Exception):
    """A model pool refused the start for its deadline (:class:`protocol.values.DeadlineCode`): the
    model's load and run take longer than the time left, or the time ran out while it waited
    for the load. Offering it again cannot help: the prediction ends."""

    def __init__(self, code: DeadlineCode, detail: str) -> None:
        super().__init__(f"{code} ({detail})")
        self.code = code
        self.detail = detail


class CannotServe(Exception):
    """A model pool can never run the model (``model_too_large``: its memory never fits the
    host's budget). Offering it again cannot help, and the input is not at fault."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code} ({detail})")
        self.code = code
        self.detail = detail


_HINT = "give the caller the runner's CONDUIT_RUNNER_TOKEN"


def error_for(reading: Reading, body: str) -> Exception:
    """The exception an answer that was not accepted raises (``body``: its whole text)."""
    match reading.verdict:
        case Verdict.REFUSED:
            assert reading.refusal is not None
            return _REFUSED[reading.refusal](reading.detail, reading.retry_after)
        case Verdict.INPUT_REJECTED:
            return InputRejected(body)
        case Verdict.OUT_OF_TIME:
            assert reading.code is not None  # only a deadline problem reads so
            return OutOfTime(DeadlineCode(reading.code), _problem_detail(body))
        case Verdict.CANNOT_SERVE:
            return CannotServe(reading.code or "", _problem_detail(body))
        case Verdict.UNAUTHORIZED:
            return RunnerUnauthorized(
                f"runner answered {reading.status} ({_HINT}): {reading.detail[:300]}"
            )
        case Verdict.NOT_RUNNING:
            return NotRunning(reading.detail)
        case Verdict.UNREACHABLE:
            return RunnerError(reading.detail)
    return RunnerError(reading.error)


def _problem_detail(body: str) -> str:
    """A problem's ``detail``, else the body itself (cut short)."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, str) else body[:500]
