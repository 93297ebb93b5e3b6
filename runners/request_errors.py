"""The refusals of a request as it was sent: who sent it (no runner token, or a call only the
runner's director may make) and what its body carries (an input the schema refuses, a
``Content-Encoding``, a webhook the SSRF guard refuses). Each is a
:class:`runners.errors.RequestRefused`, answered as every refusal is
(:func:`runners.problems.refusal`); the tree and its status codes are in :mod:`runners.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from protocol.headers import (
    ACCEPT_ENCODING,
    AUTHORIZATION,
    CONTENT_ENCODING,
    JSON,
    WWW_AUTHENTICATE,
)
from runners.errors import RequestRefused


@dataclass(frozen=True)
class ValidationIssue:
    """One entry of a 422 ``detail`` list: ``loc`` is ``["body", "input", field]``."""

    field: str
    msg: str
    type: str = "value_error"


class UnauthorizedError(RequestRefused):
    """Raised when the runner has a token and a request (other than a health check) does not
    carry it as ``Authorization: Bearer``."""

    status = 401
    code = "unauthorized"
    title = "Unauthorized"
    reason = "unauthorized"

    def __init__(self) -> None:
        super().__init__("this runner needs Authorization: Bearer <its CONDUIT_RUNNER_TOKEN>")

    def members(self) -> dict[str, Any]:
        return {"field": AUTHORIZATION}

    def headers(self) -> dict[str, str]:
        return super().headers() | {WWW_AUTHENTICATE: 'Bearer realm="conduit-runner"'}


class InternalOnlyError(RequestRefused):
    """Raised when a call only the runner's own director may make (shutdown, cancel, attach
    or taking over a prediction's snapshots) comes to a runner without a token, from a peer
    that loopback trust (``CONDUIT_RUNNER_TRUST_LOOPBACK``, :mod:`runners.auth`) does not
    cover."""

    status = 403
    code = "internal-only"
    title = "Forbidden"
    reason = "internal_only"

    def __init__(self, action: str, detail: str | None = None) -> None:
        super().__init__(
            detail
            or f"{action} is accepted only from loopback, or with the runner token "
            "(set CONDUIT_RUNNER_TOKEN on the runner and its director)"
        )


class InputValidationError(RequestRefused):
    """Raised when the input fails validation against ``components.schemas.Input``; answered
    as Cog (FastAPI) answers it: ``{"detail": [{"loc", "msg", "type"}, ...]}``."""

    status = 422
    code = "invalid-input"
    reason = "invalid"
    media_type = JSON

    def __init__(self, issues: list[ValidationIssue]) -> None:
        super().__init__("; ".join(f"{issue.field}: {issue.msg}" for issue in issues))
        self.issues = issues

    def body(self) -> dict[str, Any]:
        detail = [
            {"loc": ["body", "input", issue.field], "msg": issue.msg, "type": issue.type}
            for issue in self.issues
        ]
        return {"detail": detail}


class UnsupportedEncodingError(RequestRefused):
    """Raised for a request body sent with a ``Content-Encoding``: Cog's protocol never
    compresses a body, and one inflated only to be refused costs far more than it weighs."""

    status = 415
    code = "unsupported-content-encoding"
    title = "Unsupported Media Type"
    reason = "unsupported_encoding"

    def __init__(self, encoding: str) -> None:
        super().__init__(
            f"request bodies are not decoded: send it without Content-Encoding ({encoding!r})"
        )

    def members(self) -> dict[str, Any]:
        return {"field": CONTENT_ENCODING}

    def headers(self) -> dict[str, str]:
        # RFC 9110 §15.5.16: name the encodings that would be accepted (none but identity).
        return super().headers() | {ACCEPT_ENCODING: "identity"}


class WebhookRefusedError(RequestRefused):
    """Raised when a prediction names a webhook the SSRF guard refuses (an internal address
    not in ``CONDUIT_RUNNER_WEBHOOK_ALLOW``); answered as the runner answers other bad bodies,
    ``{"detail": [{"loc": ["body", "webhook"], ...}]}``, before anything runs."""

    status = 422
    code = "webhook-refused"
    reason = "invalid"
    media_type = JSON

    def body(self) -> dict[str, Any]:
        return {"detail": [{"loc": ["body", "webhook"], "msg": str(self), "type": "value_error"}]}
