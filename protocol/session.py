"""The plumbing under every call of the runner client: one pooled aiohttp session, never
resending a request on its own (:func:`without_resends`), and what each call goes through it
with (:class:`RunnerSession`: the runner's address and its token).

aiohttp rather than httpx on this path: with many requests in flight httpx 0.28 was measured
an order of magnitude slower (see the design notes), and the director talks to its runner for
every prediction.

With a runner token (``CONDUIT_RUNNER_TOKEN``), every call carries it as ``Authorization:
Bearer``; a stock Cog server ignores the header.
"""

from __future__ import annotations

import aiohttp

from protocol.headers import bearer

__all__ = ["RunnerSession", "without_resends"]


def without_resends(session: aiohttp.ClientSession) -> aiohttp.ClientSession:
    """``session``, told never to send a request a second time on its own.

    aiohttp sends an idempotent request (a start is a ``PUT``) once more when its connection
    breaks off before the answer. To a runner that died running the prediction and came back,
    that second ``PUT`` is a second run under the same claim; whether to start again is the
    director's decision (:class:`protocol.errors.NoAnswer`). aiohttp has no public switch: its
    own test client turns the same attribute off.
    """
    session._retry_connection = False
    return session


class RunnerSession:
    """One runner, reached at ``base_url`` through ``session``."""

    def __init__(self, base_url: str, session: aiohttp.ClientSession, token: str | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        #: Headers on every call: the runner token, when there is one.
        self.auth: dict[str, str] = bearer(token) if token else {}
