"""The refusals of a control call (capabilities, model load and unload, cache flush, load
tasks): the control branch of the one refusal tree whose root is
:class:`runners.errors.RequestRefused`, answered as every refusal is
(:func:`runners.problems.refusal`)::

    RequestRefused                 (runners.errors)                                status code
    ├── UnavailableError           a control call while the runner is ...  503 + Retry-After
    │   ├── StartingError          ... starting                                      starting
    │   ├── StoppingError          ... stopping                                      stopping
    │   └── NonceStoreUnavailableError  ... cannot reach its nonce store
    │                                                                 nonce-store-unavailable
    ├── InvalidJSONError           a control call's body is not JSON          400 invalid-json
    ├── InvalidBodyError           a control call's body is not an object     400 invalid-body
    ├── InvalidFieldError          a control call's field is missing or bad  422 invalid-field
    ├── OpTokenRequiredError       a lifecycle call without a token     401 op-token-required
    ├── OpTokensNotConfiguredError  lifecycle calls are off (no key) 403 op-tokens-not-configured
    ├── OpTokenError               the token fails a check (runners.optokens)  403 (per check)
    ├── UnknownModelError          a control call names a model not served    404 unknown-model
    ├── UnknownTaskError           a load task id this runner does not know    404 unknown-task
    └── LifecycleConflictError     load/unload now would break something 409 lifecycle-conflict
        └── CacheBusyError         the model refuses to drop its caches now     409 cache-busy

An operation token (:mod:`runners.optokens`) is refused with the first check it fails, each
answered 403 with its own ``code``::

    OpTokenError                                                              code
    ├── MalformedOpTokenError       not base64url, not JSON, or not the   malformed-op-token
    │                               expected shape
    ├── BadSignatureError           the HMAC does not match (tampered     bad-signature
    │                               body or another key)
    ├── OutsideValidityWindowError  issuedAt is more than max_skew in     outside-validity-window
    │                               the past or future
    ├── OperationMismatchError      the token is for another operation    operation-mismatch
    ├── ModelMismatchError          the token is for another model        model-mismatch
    ├── RunnerMismatchError         the token names another runner        runner-mismatch
    ├── InsufficientSignersError    fewer than min_signers configured     insufficient-signers
    │                               names are listed
    └── ReplayedNonceError          the nonce was already accepted        replayed-nonce
                                    within the window

A nonce store that does not answer refuses the call with :class:`NonceStoreUnavailableError`
(503): no lifecycle call runs without replay protection.
"""

from __future__ import annotations

from typing import Any

from runners.errors import RequestRefused


class UnavailableError(RequestRefused):
    """Base: the runner cannot answer a control call while it starts or stops."""

    status = 503
    title = "Runner unavailable"
    retry_after = 1


class StartingError(UnavailableError):
    code = "starting"

    def __init__(self) -> None:
        super().__init__("runner is starting")


class StoppingError(UnavailableError):
    code = "stopping"

    def __init__(self) -> None:
        super().__init__("runner is stopping")


class NonceStoreUnavailableError(UnavailableError):
    """Raised when a lifecycle call cannot record its token's nonce (Redis does not answer):
    refused rather than run without replay protection."""

    code = "nonce-store-unavailable"

    def __init__(self) -> None:
        super().__init__("the operation-token nonce store does not answer; retry shortly")


class InvalidJSONError(RequestRefused):
    code = "invalid-json"
    title = "Body is not JSON"


class InvalidBodyError(RequestRefused):
    code = "invalid-body"
    title = "Body must be a JSON object"


class InvalidFieldError(RequestRefused):
    """Raised when a control call's field is missing or has the wrong type or value."""

    status = 422
    code = "invalid-field"
    title = "Invalid field"

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(detail)
        self.field = field

    def members(self) -> dict[str, Any]:
        return {"field": self.field}


class OpTokenRequiredError(RequestRefused):
    status = 401
    code = "op-token-required"
    title = "Unauthorized"

    def __init__(self, operation: str) -> None:
        super().__init__(f"{operation} needs a verifiedOpToken in the body")

    def members(self) -> dict[str, Any]:
        return {"field": "verifiedOpToken"}


class OpTokensNotConfiguredError(RequestRefused):
    status = 403
    code = "op-tokens-not-configured"
    title = "Forbidden"

    def __init__(self) -> None:
        super().__init__(
            "lifecycle calls are disabled: VERIFIED_OP_TOKEN_KEY_PATH is not configured"
        )


class OpTokenError(RequestRefused):
    """Base class: an operation token was refused; the lifecycle call must not run."""

    status = 403
    code = "op-token-rejected"
    title = "Operation token rejected"

    def members(self) -> dict[str, Any]:
        return {"field": "verifiedOpToken"}


class MalformedOpTokenError(OpTokenError):
    """Raised when the token is not base64url JSON of exactly the documented shape and types."""

    code = "malformed-op-token"


class BadSignatureError(OpTokenError):
    """Raised when the signature is not the HMAC of the body under the configured key."""

    code = "bad-signature"


class OutsideValidityWindowError(OpTokenError):
    """Raised when ``issuedAt`` is more than ``max_skew`` before or after the verifier's clock."""

    code = "outside-validity-window"


class OperationMismatchError(OpTokenError):
    """Raised when a validly signed token names an operation other than the one requested."""

    code = "operation-mismatch"


class ModelMismatchError(OpTokenError):
    """Raised when a validly signed token names a model other than the one requested."""

    code = "model-mismatch"


class RunnerMismatchError(OpTokenError):
    """Raised when a validly signed token names (``runnerId``) a runner other than this one."""

    code = "runner-mismatch"


class InsufficientSignersError(OpTokenError):
    """Raised when fewer than ``min_signers`` distinct configured signer names are listed.

    Names that are not configured do not count, and a name listed twice counts once.
    """

    code = "insufficient-signers"


class ReplayedNonceError(OpTokenError):
    """Raised when the token's nonce was already accepted and is still remembered."""

    code = "replayed-nonce"


class UnknownModelError(RequestRefused):
    """Raised when a control call names a model this runner does not serve."""

    status = 404
    code = "unknown-model"
    title = "Unknown model"

    def __init__(self, model: str, served: str) -> None:
        super().__init__(f"This runner serves {served!r}, not {model!r}")

    def members(self) -> dict[str, Any]:
        return {"field": "modelId"}


class UnknownTaskError(RequestRefused):
    status = 404
    code = "unknown-task"
    title = "Not found"

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no load task {task_id}")


class LifecycleConflictError(RequestRefused):
    """Raised when a load or unload cannot happen now (e.g. predictions are running)."""

    status = 409
    code = "lifecycle-conflict"
    title = "Conflict"


class CacheBusyError(LifecycleConflictError):
    """Raised when a model refuses to drop its own caches now (an LLM engine with requests
    running keeps its prefix cache)."""

    code = "cache-busy"
