"""The runner contract's header names and media types, as every side spells them (Cog's, and
Conduit's additions: see :mod:`protocol`)."""

from __future__ import annotations

from typing import Final

# standard HTTP header names, as the runner and the director spell them
CONTENT_TYPE: Final = "Content-Type"
ACCEPT: Final = "Accept"
LOCATION: Final = "Location"
AUTHORIZATION: Final = "Authorization"
WWW_AUTHENTICATE: Final = "WWW-Authenticate"
CONTENT_ENCODING: Final = "Content-Encoding"
ACCEPT_ENCODING: Final = "Accept-Encoding"
USER_AGENT: Final = "User-Agent"
TRACE_HEADERS: Final = ("traceparent", "tracestate")
"""W3C trace context: a runner passes a prediction request's on to its webhooks."""

# media types
JSON: Final = "application/json"
NDJSON: Final = "application/x-ndjson"
"""One snapshot per line, down the response of the ``PUT`` that started the prediction."""
PROBLEM_JSON: Final = "application/problem+json"

# request headers
PREFER: Final = "Prefer"
RESPOND_ASYNC: Final = "respond-async"
"""``Prefer: respond-async``: answer 202 at once (Cog)."""
IF_MATCH: Final = "If-Match"
ATTACH: Final = "*"
"""``If-Match: *``: follow the prediction if it runs here; start nothing (412 otherwise)."""
TENANT_ID: Final = "X-Tenant-ID"
PRIORITY: Final = "X-Priority"
CACHE_MODE: Final = "X-Cache-Mode"
CACHE_TAG: Final = "X-Cache-Tag"
DEADLINE: Final = "X-Conduit-Deadline"
"""Seconds (a decimal) the prediction has left, covering queue + load + run on the runner."""

# response headers
RETRY_AFTER: Final = "Retry-After"
QUEUE_WAIT_MS: Final = "X-Queue-Wait-Ms"
GPU_TIME_MS: Final = "X-GPU-Time-Ms"
PROCESSING_TIME: Final = "X-Processing-Time"
"""Seconds (a decimal) the runner spent on the request."""
LOAD_TIME: Final = "X-Conduit-Load-Time"
"""Seconds (a decimal) a model pool held the start while its model was made ready (evictions
and the load); absent when the model was ready."""
POOL_QUEUE_WAIT: Final = "X-Conduit-Queue-Wait"
"""Seconds (a decimal) a model pool queued the start for a permit once its model was ready;
absent when it queued none."""
CACHE_HIT: Final = "X-Cache-Hit"
CACHE_TOKENS_REUSED: Final = "X-Cache-Tokens-Reused"
RATE_LIMIT_LIMIT: Final = "X-RateLimit-Limit"
RATE_LIMIT_REMAINING: Final = "X-RateLimit-Remaining"
RATE_LIMIT_RESET: Final = "X-RateLimit-Reset"


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header that carries ``token`` (the runner token, on each call)."""
    return {AUTHORIZATION: f"Bearer {token}"}
