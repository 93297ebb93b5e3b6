"""The seam between the control API's HTTP routes (:mod:`runners.control`) and what they control.

A single runner (:class:`runners.runner_plane.RunnerControlPlane`) and a model pool
(:class:`runners.pool.plane.PoolControlPlane`) each implement :class:`ControlPlane`; the routes,
the runner token and the operation-token check are the same code for both. A plane answers in
the runner API spec's documents (:mod:`protocol.lifecycle`) and refuses with
:mod:`runners.errors` / :mod:`runners.control_errors`; it never sees HTTP, nor the token: the
routes verify it before they call the plane.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from protocol.lifecycle import FlushResult, HealthDocument, LoadTask, UnloadResult
from protocol.values import FlushScope
from runners.config import RunnerConfig
from runners.nonces import NonceStore, RedisNonceStore
from runners.optokens import OpTokenVerifier


class ControlPlane(Protocol):
    """What ``/v1/capabilities``, ``/v1/models/load`` (and its task), ``/v1/models/unload``,
    ``/v1/cache/flush``, ``/health`` and ``/metrics`` act on."""

    @property
    def op_tokens(self) -> OpTokenVerifier | None:
        """The verifier of lifecycle calls' tokens; None refuses them all (no key)."""
        ...

    @property
    def name(self) -> str:
        """The ``modelId`` an operation token names for a flush that covers the whole host."""
        ...

    async def capabilities(self) -> dict[str, Any]:
        """The capability document's JSON."""
        ...

    def load(self, model_id: str, evict: str | None) -> LoadTask:
        """Start loading ``model_id`` (unloading ``evict`` first); its task as it starts."""
        ...

    def load_task(self, task_id: str) -> LoadTask:
        """A load task by id; raises :class:`~runners.control_errors.UnknownTaskError`."""
        ...

    async def unload(self, model_id: str) -> UnloadResult: ...

    async def flush(self, scope: FlushScope, value: str | None) -> FlushResult: ...

    async def health(self) -> HealthDocument:
        """The spec's health document; answered 503 when it lists ``reasons``."""
        ...

    def metrics(self) -> bytes:
        """The Prometheus exposition of the host's figures."""
        ...


def op_token_verifier(config: RunnerConfig, runner_id: str) -> OpTokenVerifier | None:
    """The verifier for a host's lifecycle calls, None when no key is configured (they are
    refused); nonces are kept in Redis with ``CONDUIT_RUNNER_REDIS_URL``, else in memory."""
    if not os.environ.get("VERIFIED_OP_TOKEN_KEY_PATH"):
        return None
    nonces: NonceStore | None = None
    if config.redis_url:
        nonces = RedisNonceStore.from_url(config.redis_url)
    return OpTokenVerifier.from_env(runner_id=runner_id, nonce_store=nonces)
