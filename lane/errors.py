"""Why the lane answers a ``/run`` with no run (the api maps each to problem+json)::

LaneError           (abstract)
├── OutOfCapacity   no permit: the queue is full, no runner freed up in time, or no
│                   runner serves the destination (429 out_of_capacity + Retry-After)
├── RunFailed       the run failed on its runner(s) before its answer began (502
│                   runner_failed)
├── RunnerUnavailable every runner of the destination refused this server's runner token
│                   and is out of service (503 runner_unavailable + Retry-After)
└── LaneNotRunning  this process runs no lane (503)
"""

from __future__ import annotations

from lane.events import Reject, RejectReason


class LaneError(Exception):
    """Base class: a ``/run`` the lane ends without a run to answer."""


class OutOfCapacity(LaneError):
    """No permit for the request: ``reason`` says why, ``retry_after_s`` when to ask again."""

    def __init__(self, reject: Reject) -> None:
        super().__init__(reject.reason.value)
        self.reason: RejectReason = reject.reason
        self.retry_after_s = reject.retry_after_s


class RunFailed(LaneError):
    """The run failed on its runner(s) (after retries, where the lane allowed one)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class RunnerUnavailable(LaneError):
    """Every runner that could take the request refused this server's runner token: a
    misconfiguration of the platform, not the request's failure (no run is recorded)."""

    def __init__(self, reject: Reject) -> None:
        super().__init__(reject.reason.value)
        self.retry_after_s = reject.retry_after_s


def refusal(reject: Reject) -> LaneError:
    """The lane error a ``Reject`` is raised as."""
    if reject.reason is RejectReason.RUNNER_UNAVAILABLE:
        return RunnerUnavailable(reject)
    return OutOfCapacity(reject)


class LaneNotRunning(LaneError):
    """The lane is not running in this process."""
