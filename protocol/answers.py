"""How a runner's answer to a prediction request reads: the one status table.

Every caller of a runner -- the director's start and attach (:mod:`protocol.client`), the
synchronous lane's call, and anything later that calls a runner -- reads an answer's status
code and problem+json ``code`` here, into one :class:`Verdict`; each caller then decides what
the verdict means for its own work (the director retries a refusal later on its one runner, the
lane on another runner), but no caller reads a status code itself.

=====================================  ==============  ======================================
answer (status, ``code``)              verdict         who sends it
=====================================  ==============  ======================================
2xx                                    accepted        every runner
409                                    refused: busy   stock Cog, a Conduit runner (no queue)
429                                    refused: rate   a Conduit runner (``rate_limit_exceeded``)
503 problem+json (any ``code``)        refused: full   a Conduit runner (``queue_full``, and its
                                                       control plane's ``starting`` ...), a
                                                       pool host (``queue_full``, ``cooldown``,
                                                       ``load_failed``)
503 ``{"error": {"code": queue_full}}``  refused: full   a runner that follows the runner API spec
503 other (Cog's body)                 refused: setup  stock Cog, a Conduit runner (not ready)
422 ``deadline_unmeetable``            out of time     a pool host (``X-Conduit-Deadline``)
504 ``deadline_exceeded``              out of time     a pool host
422 ``model_too_large``                cannot serve    a pool host: the model never fits it
400, 422 (any other)                   bad input       every runner (the input or the webhook)
401, 403                               unauthorized    a Conduit runner or pool host (token)
412                                    not running     a Conduit runner (attach, ``If-Match``)
anything else (404, 5xx ...)           broken          -
no answer (connection failed)          unreachable     -
=====================================  ==============  ======================================

Only an answer that reads ``bad input`` is the client's doing; ``cannot serve`` and ``out of
time`` are final for this runner but say nothing against the input.
"""

from __future__ import annotations

import email.utils
import enum
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from protocol.headers import CONTENT_TYPE, PROBLEM_JSON, RETRY_AFTER
from protocol.values import DeadlineCode, ErrorCode, PoolCode


class Verdict(enum.StrEnum):
    """What a runner's answer to a prediction request says."""

    ACCEPTED = "accepted"
    """It took the prediction (async, or answered or streaming it)."""
    REFUSED = "refused"
    """At capacity now (see :class:`Refusal`); ask again later, or elsewhere."""
    INPUT_REJECTED = "input_rejected"
    """It refused the request itself (its input, or the webhook it names): the client's doing."""
    OUT_OF_TIME = "out_of_time"
    """A pool host cannot load and run it in the time it was told it has (or the time ran out
    while it waited): offering it to this runner again cannot help."""
    CANNOT_SERVE = "cannot_serve"
    """A pool host can never run this model (``model_too_large``): final for this runner, and
    nothing against the input."""
    UNAUTHORIZED = "unauthorized"
    """The runner refused the caller's runner token: configuration, not the prediction."""
    NOT_RUNNING = "not_running"
    """412 to an attach: the runner is not running the prediction."""
    BROKEN = "broken"
    """An answer the protocol does not allow here (a 5xx, an unknown status, a body that does
    not read): the call failed."""
    UNREACHABLE = "unreachable"
    """No answer: the runner could not be reached, or broke off (not from the table: the
    client says it)."""


class Refusal(enum.StrEnum):
    """Why a runner refused (a ``refused`` verdict); its label in metrics."""

    BUSY = "busy"
    SATURATED = "saturated"
    NOT_READY = "not_ready"
    RATE_LIMITED = "rate_limited"


#: Statuses whose verdict does not depend on a problem ``code``.
_BY_STATUS: Final[dict[int, Verdict]] = {
    400: Verdict.INPUT_REJECTED,
    401: Verdict.UNAUTHORIZED,
    403: Verdict.UNAUTHORIZED,
    409: Verdict.REFUSED,
    412: Verdict.NOT_RUNNING,
    422: Verdict.INPUT_REJECTED,
    429: Verdict.REFUSED,
    503: Verdict.REFUSED,
}
#: Problems (status, ``code``) that read otherwise than their status alone.
_BY_PROBLEM: Final[dict[tuple[int, str], Verdict]] = {
    (422, DeadlineCode.UNMEETABLE): Verdict.OUT_OF_TIME,
    (504, DeadlineCode.EXCEEDED): Verdict.OUT_OF_TIME,
    (422, PoolCode.MODEL_TOO_LARGE): Verdict.CANNOT_SERVE,
}


@dataclass(frozen=True, slots=True)
class Reading:
    """One answer, read: its verdict, and what else the caller needs from it."""

    verdict: Verdict
    status: int = 0
    """0 when there was no answer (``unreachable``)."""
    code: str | None = None
    """The problem+json ``code`` (or the runner API spec's ``error.code``), when it has one."""
    refusal: Refusal | None = None
    """Set when the verdict is ``refused``."""
    retry_after: float | None = None
    """Seconds, from ``Retry-After``; None when absent or unreadable."""
    detail: str = ""
    """The answer's body (cut short), or what went wrong when there was none."""

    @property
    def error(self) -> str:
        """How the answer reads in a log line or a run's error."""
        if self.verdict is Verdict.UNREACHABLE:
            return self.detail
        code = f" {self.code}" if self.code else ""
        return f"runner answered {self.status}{code}: {self.detail[:300]}"


def read(status: int, headers: Mapping[str, str], text: str) -> Reading:
    """Read an answer to a prediction request (``headers`` looked up case-insensitively, as
    aiohttp's are)."""
    if 200 <= status < 300:
        return Reading(Verdict.ACCEPTED, status)
    code = _code(headers, text)
    verdict = (code is not None and _BY_PROBLEM.get((status, code))) or _BY_STATUS.get(status)
    retry_after = parse_retry_after(headers.get(RETRY_AFTER))
    if verdict is None:
        return Reading(Verdict.BROKEN, status, code, None, retry_after, text[:500])
    refusal = _refusal(status, headers, code) if verdict is Verdict.REFUSED else None
    return Reading(verdict, status, code, refusal, retry_after, text[:500])


def unreachable(detail: str) -> Reading:
    """The reading of a call that got no answer."""
    return Reading(Verdict.UNREACHABLE, detail=detail)


def _refusal(status: int, headers: Mapping[str, str], code: str | None) -> Refusal:
    if status == 409:
        return Refusal.BUSY
    if status == 429:
        return Refusal.RATE_LIMITED
    # A full queue answers problem+json (a Conduit runner, a pool host) or the spec's error;
    # Cog's "not ready" answers {"error": <message>, "status": "failed"}.
    if _is_problem(headers) or code == ErrorCode.QUEUE_FULL:
        return Refusal.SATURATED
    return Refusal.NOT_READY


def _is_problem(headers: Mapping[str, str]) -> bool:
    return headers.get(CONTENT_TYPE, "").startswith(PROBLEM_JSON)


def _code(headers: Mapping[str, str], text: str) -> str | None:
    """The problem's ``code``, or the runner API spec's ``error.code``; None without one."""
    if not text or text[0] != "{":
        return None
    try:
        body: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    code = body.get("code") if _is_problem(headers) else None
    if code is None and isinstance(error := body.get("error"), dict):
        code = error.get("code")
    return code if isinstance(code, str) else None


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delay-seconds or an HTTP-date; None if absent or
    unreadable. A date in the past means "now" (0)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)
