"""What serves a slot's model while it is loaded: a Cog-protocol server on a loopback port, as
the pool drives it (:class:`Backend`), and the :class:`LoadError` its start raises.

Both kinds start a server the pool proxies to, so a slot answers exactly as a single runner
of the same kind would: :class:`runners.pool.conduit_backend.ConduitBackend` serves a Conduit
model in this process, :class:`runners.pool.cog_backend.CogBackend` a stock Cog server as a
subprocess; :func:`runners.pool.backend_factory.build` makes the kind a model's entry names.

The pool's core bounds a load by the model's ``load_timeout``: it cancels :meth:`start` and
calls :meth:`stop`, which must then undo a partial start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class LoadError(Exception):
    """The backend could not start; the message says why (it becomes the slot's reason)."""


class Backend(Protocol):
    """A slot's server: started on a load, stopped on an unload."""

    device: str
    """``cpu`` or ``cuda``: where its memory lives (the capabilities list reports it)."""

    @property
    def url(self) -> str | None:
        """The running server's base URL; None while it is not running."""

    @property
    def headers(self) -> Mapping[str, str]:
        """Headers every proxied call carries (the server's own token)."""

    async def start(self, devices: tuple[int, ...]) -> int:
        """Start the server on ``devices`` (the GPUs the pool placed it on; empty: none) and
        wait until it serves; the bytes it observed taking. Raises :class:`LoadError`."""

    async def stop(self) -> None:
        """Stop the server and free its memory (also after a partial or failed start)."""

    async def settled(self, prediction_id: str) -> None:
        """Return once the prediction no longer runs (a ``respond-async`` one goes on after
        its response was answered; its permit is held until then)."""

    def openapi(self) -> dict[str, Any] | None:
        """The model's OpenAPI schema when known without a load."""
