"""What a running pool host holds, shared by its routes (:mod:`runners.pool.slot_routes`), its
control plane (:mod:`runners.pool.plane`) and its metrics: built when the app starts, under
``app[POOL]``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from runners.errors import UnknownSlotError
from runners.optokens import OpTokenVerifier
from runners.pool.backends import Backend
from runners.pool.config import MemoryProbe
from runners.pool.config_file import PoolFile
from runners.pool.core import PoolCore
from runners.pool.host import PoolHost
from runners.pool.slots import SlotView


@dataclass
class Pool:
    file: PoolFile
    host: PoolHost
    session: aiohttp.ClientSession
    """The one client session the pool proxies through."""
    runner_id: str
    op_tokens: OpTokenVerifier | None
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    began: float = field(default_factory=time.monotonic)
    running: dict[str, set[str]] = field(default_factory=dict)
    """Prediction ids each slot runs (granted, not yet settled)."""
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def core(self) -> PoolCore:
        return self.host.core

    def backend(self, name: str) -> Backend:
        """The slot's backend; :class:`UnknownSlotError` (404) for a model the pool lacks."""
        backend = self.host.backends.get(name)
        if backend is None:
            raise UnknownSlotError(name, None)
        return backend

    def view(self, name: str) -> SlotView:
        return next(v for v in self.core.slots() if v.model == name)

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` past the request that started it; cancelled when the app stops."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


POOL = web.AppKey("pool", Pool)
PROBE = web.AppKey("probe", MemoryProbe)
